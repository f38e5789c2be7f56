"""Token ids for the simulated tokenizer: `/v1/tokenize`, `/v1/detokenize` and `/generate`'s `output_ids`.

Ids follow the shared count rule (`tokencount`): one id per word, plus one per further 4
characters of a long word. The one-token words the simulated model writes have fixed ids, so its
output decodes back to the same text; any other piece gets a stable hashed id that decodes to `?`.
"""

from __future__ import annotations

import re
import zlib

from tokencount import ONE_TOKEN_WORDS

FIRST_WORD_ID = 10  # ids below are reserved for special tokens (the profile's EOS among them)
_HASHED_BASE = 1000
_HASHED_SPAN = 30000
VOCAB_SIZE = _HASHED_BASE + _HASHED_SPAN
_WORD = re.compile(r"\S+")
_IDS = {word: FIRST_WORD_ID + i for i, word in enumerate(ONE_TOKEN_WORDS)}


def _piece_id(piece: str) -> int:
    known = _IDS.get(piece)
    if known is not None:
        return known
    return _HASHED_BASE + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % _HASHED_SPAN


def encode(text: str) -> list[int]:
    """Token ids of `text` (as many as `tokencount.count_tokens(text)`)."""
    ids: list[int] = []
    for word in _WORD.findall(text):
        if word in _IDS:
            ids.append(_IDS[word])
        else:
            ids.extend(_piece_id(word[i : i + 4]) for i in range(0, len(word), 4))
    return ids


def decode(ids: list[int]) -> str:
    """Text of `ids`: known words with a leading space each, `?` for any other id."""
    words = ONE_TOKEN_WORDS
    return "".join(
        " " + words[i - FIRST_WORD_ID] if FIRST_WORD_ID <= i < FIRST_WORD_ID + len(words) else " ?" for i in ids
    )
