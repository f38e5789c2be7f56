"""Synthetic requests of a requested token length, reproducible from a seed."""

from __future__ import annotations

import random
from collections.abc import Iterator

from loadtest.records import RequestSpec
from loadtest.workloads.lengths import LengthDist
from tokencount import ONE_TOKEN_WORDS, count_tokens

# Prompts draw from the first 85 shared one-token words (the list prompts used before the rule
# was shared), so a seed still gives the very prompts it gave in earlier results.
_VOCABULARY = ONE_TOKEN_WORDS[:85]


class PromptFactory:
    """Makes `RequestSpec`s: random words totalling the input length, and an output length.

    Lengths are drawn by `lengths` (default: uniformly from [R * L, L] with `range_ratio` R <
    1, bench_serving's `--random-range-ratio`, else fixed), from the same generator as the words.
    """

    def __init__(
        self, input_len: int, output_len: int, range_ratio: float = 1.0, seed: int = 0, lengths: LengthDist | None = None
    ) -> None:
        if input_len < 1 or output_len < 1:
            raise ValueError("input and output lengths must be at least 1 token")
        self.input_len = input_len
        self.output_len = output_len
        self.lengths = lengths or LengthDist.of(None, range_ratio)
        self._rng = random.Random(seed)

    def prompt(self, tokens: int) -> str:
        """A prompt of about `tokens` tokens; it starts with a random id so no two share a prefix."""
        words = [f"r{self._rng.randrange(16**6):06x}"]
        words.extend(self._rng.choice(_VOCABULARY) for _ in range(max(tokens - count_tokens(words[0]), 0)))
        return " ".join(words)

    def next(self) -> RequestSpec:
        """The next request."""
        input_len = self.lengths.draw(self._rng, self.input_len)
        return RequestSpec(
            prompt=self.prompt(input_len), input_len=input_len, output_len=self.lengths.draw(self._rng, self.output_len)
        )

    def take(self, n: int) -> Iterator[RequestSpec]:
        """The next `n` requests."""
        for _ in range(n):
            yield self.next()
