"""A cheap, deterministic stand-in for a tokenizer, and the pseudo-text the simulated model writes.

Token counting is the shared rule of `tokencount` (one token per word, plus one per further 4
characters of a long word), so a synthetic prompt of N words of up to 4 characters is N prompt
tokens; the load generator counts with the same rule. Chat requests add a fixed chat-template
overhead per message, like a real template's role headers.

Generated text is a stream of short words (each a single token under the rule above, with a
leading space), taken from a fixed pseudo-random word sequence chosen by the server's seed; where
a request starts in that sequence depends on its prompt. So the same seed and prompt always give
the same text, and re-tokenizing any generated text gives exactly the tokens it was generated as.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable

from tokencount import ONE_TOKEN_WORDS, count_tokens

__all__ = ["CHAT_REPLY_PRIMER_TOKENS", "CHAT_TOKENS_PER_MESSAGE", "PseudoText", "count_chat_tokens", "count_tokens"]

# Template tokens around each chat message (role header, end-of-turn) and before the reply.
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_REPLY_PRIMER_TOKENS = 3

_VOCABULARY = ONE_TOKEN_WORDS


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
