"""A cheap, deterministic stand-in for a tokenizer, and the pseudo-text the simulated model writes.

Token counting is the shared rule of `tokencount` (one token per word, plus one per further 4
characters of a long word), so a synthetic prompt of N words of up to 4 characters is N prompt
tokens; the load generator counts with the same rule. Token ids come from `vocab`. A chat prompt
is tokenized as a Llama-3-style template would: per message a 3-token role header, the content, an
end-of-turn token; then the assistant's header opens the reply. So a finished turn's prompt plus
its output is a prefix of the next turn's templated prompt, as a prefix cache needs.

Generated text is a stream of short words (each a single token under the rule above, with a
leading space), taken from a fixed pseudo-random word sequence chosen by the server's seed; where
a request starts in that sequence depends on its prompt. So the same seed and prompt always give
the same text, and re-tokenizing any generated text gives exactly the tokens it was generated as.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable

from backends.sim import vocab
from tokencount import ONE_TOKEN_WORDS, count_tokens

__all__ = [
    "CHAT_REPLY_PRIMER_TOKENS",
    "CHAT_TOKENS_PER_MESSAGE",
    "PseudoText",
    "chat_prompt_ids",
    "chat_prompt_key",
    "count_chat_tokens",
    "count_tokens",
]

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


def _header(role: str) -> list[int]:
    return [vocab.START_HEADER_ID, vocab.role_id(role), vocab.END_HEADER_ID]


_REPLY_PRIMER = _header("assistant")


def chat_prompt_ids(messages: Iterable[tuple[str, str]]) -> list[int]:
    """Token ids of a chat prompt of (role, text) messages, ending with the assistant's header.

    As many as `count_chat_tokens` of the texts.
    """
    ids: list[int] = []
    for role, text in messages:
        ids += _header(role)
        ids += vocab.encode(text)
        ids.append(vocab.END_OF_TURN_ID)
    ids += _REPLY_PRIMER
    return ids


def chat_prompt_key(messages: Iterable[tuple[str, str]]) -> str:
    """The text of a chat prompt's (role, text) messages that chooses where its output starts (`PseudoText.start_for`)."""
    return "\n".join(text for _, text in messages)


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
        ids = [vocab.word_id(word[1:]) for word in words]
        self._ids = ids + ids

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

    def pieces(self, start: int, counts: Iterable[int]) -> list[str]:
        """The texts of consecutive runs of `counts` output tokens of a request that starts at `start` (the
        chunks of a stream whose steps gave those counts): together `text(start, 0, sum(counts))`."""
        texts, offsets, length = self._text, self._offsets, self.length
        out: list[str] = []
        first = 0
        for count in counts:
            if count < length:  # one slice of the cycle written twice
                index = (start + first) % length
                out.append(texts[offsets[index] : offsets[index + count]])
            else:
                out.append(self.text(start, first, count))
            first += count
        return out

    def token_ids(self, start: int, first: int, count: int) -> list[int]:
        """Token ids of the same output tokens as `text(start, first, count)`, which they encode to."""
        ids: list[int] = []
        index = (start + first) % self.length
        while count > 0:
            take = min(count, self.length)
            ids += self._ids[index : index + take]
            count -= take
        return ids
