"""Token ids for the simulated tokenizer: prompts, `/v1/tokenize`, `/v1/detokenize` and `/generate`'s `output_ids`.

Ids follow the shared count rule (`tokencount`): one id per word, plus one per further 4
characters of a long word, so `len(encode(text)) == count_tokens(text)` and equal text gives equal
ids. The one-token words the simulated model writes have fixed ids, so its output decodes back to
the same text; any other piece gets a stable hashed id that decodes to `?`. The chat template's
tokens (header marks, end of turn) take reserved ids below the words'; a role name is one token.
"""

from __future__ import annotations

import zlib
from itertools import chain
from typing import cast

from tokencount import ONE_TOKEN_WORDS

FIRST_WORD_ID = 10  # ids below are reserved for special tokens (the profile's EOS among them)
START_HEADER_ID = 6  # the chat template's marks, Llama-3 style: header start, header end, end of turn
END_HEADER_ID = 7
END_OF_TURN_ID = 8
_HASHED_BASE = 1000
_HASHED_SPAN = 30000
VOCAB_SIZE = _HASHED_BASE + _HASHED_SPAN
# Words already seen, so a 12k-token prompt is looked up in one C-level pass: `_one` holds the words
# of one token (the common case), `_all` every word's ids. Both forget everything past the bound, so
# arbitrary text cannot grow them forever.
_WORD_CACHE_LIMIT = 1 << 18
_IDS: dict[str, int] = {word: FIRST_WORD_ID + i for i, word in enumerate(ONE_TOKEN_WORDS)}
_one: dict[str, int] = dict(_IDS)
_all: dict[str, tuple[int, ...]] = {word: (i,) for word, i in _IDS.items()}


def _hashed(piece: str) -> int:
    return _HASHED_BASE + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % _HASHED_SPAN


def _piece_id(piece: str) -> int:
    known = _IDS.get(piece)
    return known if known is not None else _hashed(piece)


def encode(text: str) -> list[int]:
    """Token ids of `text` (as many as `tokencount.count_tokens(text)`)."""
    words = text.split()  # the same words as tokencount's `\S+`: both split on str.isspace()
    ids = list(map(_one.get, words))
    if None not in ids:
        return cast(list[int], ids)  # every word was a known one-token word
    unseen = set(words).difference(_all)
    if len(_all) + len(unseen) > _WORD_CACHE_LIMIT:
        _one.clear()
        _one.update(_IDS)
        _all.clear()
        _all.update((word, (i,)) for word, i in _IDS.items())
    for word in unseen:
        pieces = _all[word] = tuple(_piece_id(word[i : i + 4]) for i in range(0, len(word), 4))
        if len(pieces) == 1:
            _one[word] = pieces[0]
    return list(chain.from_iterable(map(_all.__getitem__, words)))


def role_id(role: str) -> int:
    """The one token of a chat role's name in the template's header."""
    return _hashed(role)


def decode(ids: list[int]) -> str:
    """Text of `ids`: known words with a leading space each, `?` for any other id."""
    words = ONE_TOKEN_WORDS
    return "".join(
        " " + words[i - FIRST_WORD_ID] if FIRST_WORD_ID <= i < FIRST_WORD_ID + len(words) else " ?" for i in ids
    )


def word_id(word: str) -> int:
    """The id of one of the simulated model's one-token words."""
    return _IDS[word]
