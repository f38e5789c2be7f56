"""Synthetic requests of a requested token length, reproducible from a seed."""

from __future__ import annotations

import random
from collections.abc import Iterator

from backends.sim.tokenizer import count_tokens
from loadtest.records import RequestSpec

# Short common words that count as one token for the simulator's approximation (and for
# real BPE tokenizers alike), so the prompt length lands close to the request.
_WORDS = ["the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part"]
_VOCABULARY = tuple(word for word in _WORDS if count_tokens(word) == 1)


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
