"""Synthetic requests of a requested token length, reproducible from a seed."""

from __future__ import annotations

import random
from collections.abc import Iterator

from loadtest.records import RequestSpec
from tokencount import ONE_TOKEN_WORDS, count_tokens

# Prompts draw from the first 85 shared one-token words (the list prompts used before the rule
# was shared), so a seed still gives the very prompts it gave in earlier results.
_VOCABULARY = ONE_TOKEN_WORDS[:85]


class PromptFactory:
    """Makes `RequestSpec`s: random words totalling the input length, and an output length.

    With `range_ratio` R < 1 each length is drawn uniformly from [R * L, L] (bench_serving's
    `--random-range-ratio`); R = 1 gives fixed lengths.
    """

    def __init__(self, input_len: int, output_len: int, range_ratio: float = 1.0, seed: int = 0) -> None:
        if input_len < 1 or output_len < 1:
            raise ValueError("input and output lengths must be at least 1 token")
        if not 0.0 <= range_ratio <= 1.0:
            raise ValueError(f"range ratio must be within [0, 1], got {range_ratio}")
        self.input_len = input_len
        self.output_len = output_len
        self.range_ratio = range_ratio
        self._rng = random.Random(seed)

    def _length(self, full: int) -> int:
        low = max(1, int(full * self.range_ratio))
        return self._rng.randint(low, full)

    def prompt(self, tokens: int) -> str:
        """A prompt of about `tokens` tokens; it starts with a random id so no two share a prefix."""
        words = [f"r{self._rng.randrange(16**6):06x}"]
        words.extend(self._rng.choice(_VOCABULARY) for _ in range(max(tokens - count_tokens(words[0]), 0)))
        return " ".join(words)

    def next(self) -> RequestSpec:
        """The next request."""
        input_len = self._length(self.input_len)
        return RequestSpec(prompt=self.prompt(input_len), input_len=input_len, output_len=self._length(self.output_len))

    def take(self, n: int) -> Iterator[RequestSpec]:
        """The next `n` requests."""
        for _ in range(n):
            yield self.next()
