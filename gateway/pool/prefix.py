"""Which backends hold which prompt prefixes: an approximate map of what the gateway sent where.

A prompt (the dialect's prompt text, as bytes) is cut into `BLOCK_BYTES` blocks; block i's key is a
hash chained over blocks 0..i, so equal keys mean equal prefixes and the map is a radix tree at block
granularity, as SMG's cache_aware keeps one over request text. `PrefixTable` maps each key to the
backends it was sent to, in a fixed-size open-addressed table over a buffer: one process's own, or
shared memory every worker reads and writes (pool/board.py). A full probe window overwrites its
least recently used slot. The backends' own evictions are not seen here: `PrefixEstimate` scales a
backend's predictions by how much of them it reported cached. Concurrent writers can lose a bit or
a stamp: the map is an estimate either way.
"""

from __future__ import annotations

import array
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_BYTES = 256  # ~64 tokens of text: fine enough for conversations, cheap for 12k-token prompts
SLOT_BYTES = 24  # key (u64), backends holding it (u64 bitmask), last use (f64)
_WINDOW = 8  # slots probed per key


def block_keys(text: bytes) -> list[int]:
    """The chained keys of `text`'s whole blocks (a trailing partial block is not cached as a block).

    A CRC-32 chained over the blocks: two prefixes share a key by accident about once in 2**32
    lookups of a slot, which the map's other errors dwarf.
    """
    view = memoryview(text)
    keys = []
    key = 0
    for start in range(0, len(text) - BLOCK_BYTES + 1, BLOCK_BYTES):
        key = zlib.crc32(view[start : start + BLOCK_BYTES], key)
        keys.append(key or 1)  # 0 marks an empty slot
    return keys


@dataclass(frozen=True)
class PromptKey:
    """A request's prompt as the prefix map sees it: its block keys and its length in bytes."""

    keys: list[int]
    size: int

    @classmethod
    def of(cls, text: bytes | None) -> PromptKey | None:
        """The key of prompt text (None: the request has no single prompt)."""
        return None if text is None else cls(block_keys(text), len(text))


class PrefixEstimate:
    """Turns the prefix map's blocks into tokens, from what the backends count (EWMAs, per process).

    `tokens_per_byte` is learned from the prompt tokens responses report; `trust[i]` is the share of
    what the map predicted backend i held that it reported cached (an evicting backend's falls), so
    a prediction is `blocks * BLOCK_BYTES * tokens_per_byte * trust`. `spread` bounds how far one
    prompt's own rate has been above the mean lately (`most_tokens`, for whether a KV cache holds it):
    `COLD_SPREAD` before any response, renewed by every long prompt above the mean, fading by
    `SPREAD_FADE` per response otherwise.
    """

    RATE = 0.05
    COLD_SPREAD = 2.0  # short words or CJK text hold twice English's tokens per byte
    MAX_SPREAD = 4.0
    SPREAD_FADE = 0.98  # of the spread's excess over 1, per long prompt's response
    SPREAD_MIN_BYTES = 1024  # shorter prompts' counts are dominated by the chat template's own tokens

    def __init__(self, backends: int) -> None:
        self.tokens_per_byte = 0.25
        self.trust = [1.0] * backends
        self.spread = self.COLD_SPREAD

    def prompt_tokens(self, size: int) -> float:
        return self.tokens_per_byte * size

    def most_tokens(self, size: int) -> float:
        """The most tokens a `size`-byte prompt is likely to hold, by the rates prompts have shown."""
        return self.tokens_per_byte * size * self.spread

    def cached_tokens(self, index: int, blocks: int) -> float:
        return self.tokens_per_byte * BLOCK_BYTES * blocks * self.trust[index]

    def learn(self, index: int, size: int, prompt_tokens: int, predicted: float, reported: int | None) -> None:
        """A response of a `size`-byte prompt on backend `index`: `prompt_tokens` counted, `reported`
        cached (None: the backend does not say) where `predicted` were."""
        if prompt_tokens > 0 and size > 0:
            rate = prompt_tokens / size
            if size >= self.SPREAD_MIN_BYTES:
                faded = 1.0 + (self.spread - 1.0) * self.SPREAD_FADE
                self.spread = min(max(rate / self.tokens_per_byte, faded), self.MAX_SPREAD)
            self.tokens_per_byte += self.RATE * (rate - self.tokens_per_byte)
        if reported is not None and predicted >= 1.0:
            # Above 1: the backend also kept the answers the map never saw; the map's part is what counts.
            self.trust[index] += self.RATE * (min(reported / predicted, 1.0) - self.trust[index])


class PrefixTable:
    """Block keys -> the backends (by index, at most 64) they were sent to, in `slots` slots of `buffer`."""

    def __init__(self, buffer: memoryview, slots: int) -> None:
        if slots < _WINDOW or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two of at least {_WINDOW}, got {slots}")
        if len(buffer) < slots * SLOT_BYTES:
            raise ValueError(f"a table of {slots} slots needs {slots * SLOT_BYTES} bytes, got {len(buffer)}")
        self.slots = slots
        self._mask = slots - 1
        words = buffer[: slots * SLOT_BYTES]
        self._keys = words[: 8 * slots].cast("Q")
        self._held = words[8 * slots : 16 * slots].cast("Q")
        self._used = words[16 * slots :].cast("d")

    @staticmethod
    def size(slots: int) -> int:
        """Bytes a table of `slots` slots takes."""
        return slots * SLOT_BYTES

    def _find(self, key: int) -> int:
        """The slot holding `key`; -1 when it is not there."""
        keys, mask = self._keys, self._mask
        for j in range(_WINDOW):
            slot = (key + j) & mask
            found = keys[slot]
            if found == key:
                return slot
            if found == 0:
                return -1
        return -1

    def match(self, keys: Sequence[int], backends: int) -> list[int]:
        """Per backend index below `backends`: how many of `keys`, from the first, it holds."""
        matched = [0] * backends
        alive = (1 << backends) - 1
        held = self._held
        count = 0
        for key in keys:
            slot = self._find(key)
            still = alive & held[slot] if slot >= 0 else 0
            if still != alive:
                _set(matched, alive & ~still, count)
                alive = still
                if not alive:
                    return matched
            count += 1
        _set(matched, alive, count)
        return matched

    def sent_at(self, keys: Sequence[int], depth: int) -> float | None:
        """When the first `depth` blocks of `keys` were last sent to any backend (the time its last block was
        inserted with); None when that block is not in the map."""
        if depth <= 0:
            return None
        slot = self._find(keys[depth - 1])
        return self._used[slot] if slot >= 0 else None

    def insert(self, keys: Sequence[int], backend: int, now: float) -> None:
        """`backend` now holds every block of `keys`."""
        bit = 1 << backend
        table, held, used = self._keys, self._held, self._used
        for key in keys:
            slot = self._place(key)
            if table[slot] == key:
                held[slot] |= bit
            else:
                table[slot], held[slot] = key, bit
            used[slot] = now

    def _place(self, key: int) -> int:
        """Where `key` goes: its slot, else a free one, else the least recently used of its window."""
        table, used, mask = self._keys, self._used, self._mask
        oldest = key & mask
        for j in range(_WINDOW):
            slot = (key + j) & mask
            if table[slot] == key or table[slot] == 0:
                return slot
            if used[slot] < used[oldest]:
                oldest = slot
        return oldest

    def release(self) -> None:
        """Let go of the buffer (before shared memory under it is closed)."""
        for view in (self._keys, self._held, self._used):
            view.release()

    def occupied(self) -> int:
        """Slots holding a key (for /admin/status; a scan of the table in C)."""
        return self.slots - array.array("Q", self._keys).count(0)


def _set(matched: list[int], bits: int, count: int) -> None:
    while bits:
        low = bits & -bits
        matched[low.bit_length() - 1] = count
        bits ^= low
