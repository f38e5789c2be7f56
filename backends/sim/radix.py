"""A radix tree of token sequences, as SGLang's `RadixCache` keeps them (page size 1, LRU eviction).

`match_prefix` finds the longest stored prefix of a key, splitting the node where the match ends
inside it, and marks the nodes it entered as used; `insert` stores a key and says how much of it
was already there; `lock` and `unlock` reference-count a node's path so that what a running request
reuses is never evicted; `evict` frees at least N entries by deleting unlocked leaves, least
recently used first, a whole leaf at a time (so it may free more), and a parent left childless
becomes a candidate in turn. A shared prefix is stored once: `size = evictable_size +
protected_size`. Recency is a counter, one tick per match or insert, so no clock is needed; ties go
to the older node. With `pair_keys` (an EAGLE server: SGLang keys its tree on token bigrams) it is
the tree of each key's adjacent pairs, stored as the tokens: lengths and sizes count pairs, one
fewer than tokens. No budget lives here: the owner decides when to evict (see `kvcache.py`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

Key = list[Hashable]

# Whole slices of this many tokens are compared at C speed before the mismatch is found one by one.
_STRIDE = 256


class TreeNode:
    """One edge of the tree: the tokens on it, its children by first token, its lock count."""

    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "serial")

    def __init__(self, key: Key, parent: TreeNode | None, serial: int, last_access: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = last_access
        self.serial = serial


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The longest stored prefix of a key: its length (in entries: tokens, or pairs) and the node it ends at."""

    length: int
    node: TreeNode


def _as_key(key: Sequence[Hashable]) -> Key:
    # Edges are lists, and a list never equals a tuple: compare like with like.
    return key if isinstance(key, list) else list(key)


def _common_length(edge: Key, key: Key, start: int) -> int:
    """How many tokens `edge` shares with `key[start:]` from their starts."""
    limit = min(len(edge), len(key) - start)
    i = 0
    while i + _STRIDE <= limit and edge[i : i + _STRIDE] == key[start + i : start + i + _STRIDE]:
        i += _STRIDE
    while i < limit and edge[i] == key[start + i]:
        i += 1
    return i


class RadixTree:
    """Token sequences sharing their prefixes; see the module docstring for the contract."""

    def __init__(self, *, pair_keys: bool = False) -> None:
        # With pair keys an edge from the root holds one entry fewer than its tokens, and is used
        # only once a match covers two of them: what a tree keyed on the pairs would hold and use.
        self._root_discount = 1 if pair_keys else 0
        self._serials = itertools.count()
        self._clock = 0
        self.reset()

    def reset(self) -> None:
        """Forget every key (SGLang's `/flush_cache`); only meaningful while nothing is locked."""
        self.root = TreeNode([], None, next(self._serials), self._clock)
        self.root.lock_ref = 1  # the root is never a leaf to evict
        self.evictable_size = 0
        self.protected_size = 0
        self._leaves: set[TreeNode] = set()  # unlocked nodes without children: what `evict` may take

    @property
    def size(self) -> int:
        """Entries the tree holds."""
        return self.evictable_size + self.protected_size

    def match_prefix(self, key: Sequence[Hashable]) -> PrefixMatch:
        """The longest stored prefix of `key`; marks its path used and splits the node it ends inside."""
        node, pos = self._descend(_as_key(key))
        return PrefixMatch(self._entries(pos), node)

    def peek(self, key: Sequence[Hashable]) -> int:
        """What `match_prefix(key).length` would be, without changing the tree or its recency."""
        tokens = _as_key(key)
        node, pos = self.root, 0
        while pos < len(tokens) and (child := node.children.get(tokens[pos])) is not None:
            length = len(child.key)
            if tokens[pos : pos + length] != child.key:
                return self._entries(pos + _common_length(child.key, tokens, pos))
            node, pos = child, pos + length
        return self._entries(pos)

    def insert(self, key: Sequence[Hashable]) -> int:
        """Store `key`; returns how many of its leading entries the tree already held."""
        tokens = _as_key(key)
        node, pos = self._descend(tokens)
        if pos < len(tokens):
            leaf = TreeNode(tokens[pos:], node, next(self._serials), self._clock)
            node.children[tokens[pos]] = leaf
            self.evictable_size += self._weight(leaf)
            self._refresh(node)
            self._refresh(leaf)
        return self._entries(pos)

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one more holder)."""
        current: TreeNode | None = node
        while current is not None and current is not self.root:
            if current.lock_ref == 0:
                weight = self._weight(current)
                self.evictable_size -= weight
                self.protected_size += weight
            current.lock_ref += 1
            self._refresh(current)
            current = current.parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`."""
        current: TreeNode | None = node
        while current is not None and current is not self.root:
            current.lock_ref -= 1
            if current.lock_ref == 0:
                weight = self._weight(current)
                self.evictable_size += weight
                self.protected_size -= weight
            self._refresh(current)
            current = current.parent

    def evict(self, num_tokens: int) -> int:
        """Delete unlocked leaves, least recently used first, until `num_tokens` are freed; how many were."""
        heap = [(leaf.last_access, leaf.serial, leaf) for leaf in self._leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            weight = self._weight(leaf)
            del parent.children[leaf.key[0]]
            self._leaves.discard(leaf)
            self.evictable_size -= weight
            freed += weight
            self._refresh(parent)
            if parent in self._leaves:
                heapq.heappush(heap, (parent.last_access, parent.serial, parent))
        return freed

    def _descend(self, tokens: Key) -> tuple[TreeNode, int]:
        """Follow `tokens` down, marking the nodes entered; split where the match ends inside one.

        Returns the node the match ends at and how many tokens it covers; one tick of the clock.
        """
        self._clock += 1
        now = self._clock
        node, pos = self.root, 0
        while pos < len(tokens) and (child := node.children.get(tokens[pos])) is not None:
            length = len(child.key)
            whole = tokens[pos : pos + length] == child.key
            matched = length if whole else _common_length(child.key, tokens, pos)
            if node is not self.root or matched > self._root_discount:
                child.last_access = now
            if not whole:
                return self._split(child, matched), pos + matched
            node, pos = child, pos + length
        return node, pos

    def _entries(self, tokens: int) -> int:
        return max(tokens - self._root_discount, 0)

    def _weight(self, node: TreeNode) -> int:
        """Entries on `node`'s edge."""
        return len(node.key) - self._root_discount if node.parent is self.root else len(node.key)

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut `child`'s edge after `at` tokens; the new upper node (returned) keeps its locks and recency.

        The two edges hold the entries the one did, so the tree's sizes do not change.
        """
        parent = child.parent
        assert parent is not None
        upper = TreeNode(child.key[:at], parent, next(self._serials), child.last_access)
        upper.lock_ref = child.lock_ref
        parent.children[upper.key[0]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def _refresh(self, node: TreeNode) -> None:
        if node.lock_ref == 0 and not node.children:
            self._leaves.add(node)
        else:
            self._leaves.discard(node)
