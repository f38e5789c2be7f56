"""Prompt text as plans hold it: literal strings, and named runs of generated one-token words.

`Words(key, count)` is the first `count` words of a word stream that `key` alone chooses: equal
keys give equal words, and fewer words of a key are a prefix of more of them. So a plan can say
"these requests share this system prompt" or "these trace blocks are equal" without holding the
text, and a model of the server can compare prefixes by key. Every word is one of tokencount's
one-token words, so `count` is also the text's token count under tokencount's rule.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tokencount import ONE_TOKEN_WORDS, count_tokens

_VOCABULARY = np.array(ONE_TOKEN_WORDS, dtype=object)


@dataclass(frozen=True)
class Words:
    """`count` words of the stream named `key` (`count` tokens under tokencount's rule)."""

    key: str
    count: int

    def text(self) -> str:
        """The words, separated by single spaces."""
        return _stream(self.key, self.count)


Part = str | Words
Text = tuple[Part, ...]  # parts joined by single spaces; empty parts are left out


def render(text: Text) -> str:
    """The text of `text`'s parts."""
    return " ".join(s for s in (p if isinstance(p, str) else p.text() for p in text) if s)


def token_count(text: Text) -> int:
    """Tokens of `render(text)` under tokencount's rule, without making the text."""
    return sum(p.count if isinstance(p, Words) else count_tokens(p) for p in text)


@lru_cache(maxsize=4096)  # shared blocks (a system prompt, a trace's common first block) recur often
def _stream(key: str, count: int) -> str:
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    # One float per word, drawn in order: the first n words of a key never depend on how many follow.
    picks = (np.random.default_rng(seed).random(count) * len(_VOCABULARY)).astype(np.intp)
    return " ".join(_VOCABULARY[picks])
