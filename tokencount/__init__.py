"""The token-count rule the simulator and the load tester share, and its one-token words.

One token per whitespace-separated word, plus one per further 4 characters of a long word
(`"the"` is 1 token, `"tokenizer"` is 3). The simulator counts prompts and writes its output with
this rule; the load tester builds prompts of a requested length and splits a chunk's tokens with
it. Neither reaches into the other: both import this module.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\S+")

# Short common words of at most 4 characters, so each is one token under the rule. The order is
# part of the contract: seeded choices from this tuple (the simulator's output text, the load
# tester's prompts) stay the same only while it does.
ONE_TOKEN_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "use", "an",
    "each", "she", "do", "how", "if", "will", "up", "out", "many", "then", "them", "so", "some",
    "her", "make", "like", "him", "into", "time", "has", "look", "two", "more", "go", "see", "no",
    "way", "my", "than", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day",
    "did", "get", "come", "made", "may", "part", "over", "new", "take", "only", "just", "know",
    "year", "live", "me", "back", "give", "most", "very", "good", "man", "our", "name", "much",
    "line", "same", "tell", "boy", "turn", "here", "why", "ask", "went", "men", "read", "need",
    "land", "end", "home", "us", "move", "try", "kind", "hand", "off", "play", "big", "far", "sea",
    "draw", "left", "late", "run", "near",
)


def count_tokens(text: str) -> int:
    """Token count of `text` under the rule in the module docstring."""
    return sum(1 + (len(word) - 1) // 4 for word in _WORD.findall(text))
