"""A cheap, deterministic stand-in for a tokenizer, and the pseudo-text the simulated model writes.

Token counting: one token per whitespace-separated word, plus one per further 4 characters of a
long word (`"the"` is 1 token, `"tokenizer"` is 3), so a synthetic prompt of N words of up to 4
characters is N prompt tokens (the load generator builds its prompts and counts chunk tokens with
this function). Chat requests add a fixed chat-template overhead per message, like a real
template's role headers.

Generated text is a stream of short words (each a single token under the rule above, with a
leading space), taken from a fixed pseudo-random word sequence chosen by the server's seed; where
a request starts in that sequence depends on its prompt. So the same seed and prompt always give
the same text, and re-tokenizing any generated text gives exactly the tokens it was generated as.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterable

_WORD = re.compile(r"\S+")

# Template tokens around each chat message (role header, end-of-turn) and before the reply.
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_REPLY_PRIMER_TOKENS = 3

# Short common words; only those of at most 4 characters (one token each) are used.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "use",
    "an",
    "each",
    "she",
    "do",
    "how",
    "if",
    "will",
    "up",
    "out",
    "many",
    "then",
    "them",
    "so",
    "some",
    "her",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "go",
    "see",
    "no",
    "way",
    "my",
    "than",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "over",
    "new",
    "take",
    "only",
    "just",
    "know",
    "year",
    "live",
    "me",
    "back",
    "give",
    "most",
    "very",
    "good",
    "man",
    "our",
    "name",
    "much",
    "line",
    "same",
    "tell",
    "boy",
    "turn",
    "here",
    "why",
    "ask",
    "went",
    "men",
    "read",
    "need",
    "land",
    "end",
    "home",
    "us",
    "move",
    "try",
    "kind",
    "hand",
    "off",
    "play",
    "big",
    "far",
    "sea",
    "draw",
    "left",
    "late",
    "run",
    "near",
]


def count_tokens(text: str) -> int:
    """Approximate token count of `text` (see the module docstring for the rule)."""
    return sum(1 + (len(word) - 1) // 4 for word in _WORD.findall(text))


_VOCABULARY = tuple(word for word in _WORDS if count_tokens(word) == 1)


def count_chat_tokens(message_texts: Iterable[str]) -> int:
    """Prompt tokens of a chat request whose messages carry these texts, template overhead included."""
    total = CHAT_REPLY_PRIMER_TOKENS
    for text in message_texts:
        total += CHAT_TOKENS_PER_MESSAGE + count_tokens(text)
    return total


class PseudoText:
    """The simulated model's output: a seeded cycle of one-token words; a request reads a window of it."""

    def __init__(self, seed: int, length: int = 8192) -> None:
        rng = random.Random(seed)
        words = [" " + rng.choice(_VOCABULARY) for _ in range(length)]
        self.length = length
        # The cycle written out twice, so any window shorter than the cycle is one string slice.
        self._text = "".join(words + words)
        self._offsets = [0]
        for word in words + words:
            self._offsets.append(self._offsets[-1] + len(word))

    def start_for(self, prompt_key: str) -> int:
        """Where in the cycle the output for this prompt starts."""
        return zlib.crc32(prompt_key.encode("utf-8", "surrogatepass")) % self.length

    def text(self, start: int, first: int, count: int) -> str:
        """Text of output tokens `first .. first+count-1` of a request that starts at `start`."""
        pieces = []
        index = (start + first) % self.length
        while count > 0:
            take = min(count, self.length)
            pieces.append(self._text[self._offsets[index] : self._offsets[index + take]])
            count -= take
        return "".join(pieces)
