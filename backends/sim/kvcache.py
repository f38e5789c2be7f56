"""The KV cache of one simulated server: a token budget shared by its radix tree and its running requests.

The budget is the server's `max_total_tokens` (a co-located server's own share). The tree's tokens
(a shared prefix counted once) plus every running request's reservation never exceed it. At
admission a request locks the cached prefix it reuses and reserves its uncached prompt tokens plus
`max_new_tokens` (the sim does not retract). It fits when that reservation fits in the free tokens
plus those the tree could evict with its prefix locked, SGLang's `rem_total_tokens = available +
evictable`; the shortfall is evicted then, least recently used leaves first. When it ends, what its
KV holds goes into the tree (SGLang's `cache_finished_req`): the prompt and all of the output but
the last token, whose KV is never written; then its reservation and lock are released. An EAGLE
server keys the tree on token bigrams, as SGLang does, so it reuses one token less. Disabled
(`--disable-radix-cache`), nothing is matched or kept: a request holds only its reservation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.sim.radix import PrefixMatch, RadixTree, TreeNode


@dataclass(frozen=True, slots=True)
class Hold:
    """What one admitted request holds: the prefix it locked and the tokens it reserved."""

    node: TreeNode
    cached: int
    reserved: int


class KVCache:
    """The budget, the tree and the reservations of one server; see the module docstring."""

    def __init__(self, capacity: int, *, enabled: bool = True, bigram_keys: bool = False) -> None:
        self.capacity = capacity
        self.enabled = enabled
        self.tree = RadixTree(pair_keys=bigram_keys)
        self.reserved = 0  # what running requests reserved beyond the prefixes they lock

    @property
    def free(self) -> int:
        """Tokens neither in the tree nor reserved."""
        return self.capacity - self.reserved - self.tree.size

    def match(self, tokens: Sequence[int], limit: int) -> PrefixMatch:
        """The cached prefix of `tokens[:limit]` a request would reuse now, marked as used."""
        if not self.enabled or limit <= 0:
            return PrefixMatch(0, self.tree.root)
        return self.tree.match_prefix(tokens[:limit])

    def peek(self, tokens: Sequence[int], limit: int) -> int:
        """What `match(tokens, limit).length` would be, changing nothing."""
        if not self.enabled or limit <= 0:
            return 0
        return self.tree.peek(tokens[:limit])

    def admit(self, match: PrefixMatch, prompt_tokens: int, max_new_tokens: int) -> Hold | None:
        """Lock `match` and reserve the rest of the request, evicting what that takes; None if it cannot fit now."""
        need = prompt_tokens - match.length + max_new_tokens
        self.tree.lock(match.node)
        free = self.free
        if need > free + self.tree.evictable_size:
            self.tree.unlock(match.node)
            return None
        if need > free:
            self.tree.evict(need - free)
        self.reserved += need
        return Hold(match.node, match.length, need)

    def release(self, hold: Hold, computed: Sequence[int]) -> None:
        """End `hold`: keep the `computed` tokens (prompt, then output) in the tree, free the rest, unlock."""
        self.reserved -= hold.reserved
        if self.enabled and computed:
            self.tree.insert(computed)
        self.tree.unlock(hold.node)

    def flush(self) -> None:
        """Empty the tree; only while no request holds anything."""
        assert self.reserved == 0 and self.tree.protected_size == 0, "flush with requests holding KV"
        self.tree.reset()
