"""The tokenizer approximation and the pseudo-text's guarantees."""

from __future__ import annotations

import random
import zlib

from backends.sim import vocab
from backends.sim.tokenizer import (
    CHAT_REPLY_PRIMER_TOKENS,
    CHAT_TOKENS_PER_MESSAGE,
    PseudoText,
    chat_prompt_ids,
    count_chat_tokens,
    count_tokens,
)
from loadtest.prompts import PromptFactory
from tokencount import ONE_TOKEN_WORDS


def test_count_rule() -> None:
    assert count_tokens("") == 0
    assert count_tokens("the cat sat") == 3
    assert count_tokens("tokenizer") == 3  # 9 characters: 1 + 2 further groups of 4
    assert count_tokens("  spaced\n\tout  ") == 1 + 1 + 1


def test_chat_overhead() -> None:
    assert count_chat_tokens(["hi you", ""]) == CHAT_REPLY_PRIMER_TOKENS + 2 * CHAT_TOKENS_PER_MESSAGE + 2


def test_pseudo_text_is_deterministic_and_retokenizes_exactly() -> None:
    a, b = PseudoText(seed=7), PseudoText(seed=7)
    start = a.start_for("some prompt")
    assert start == b.start_for("some prompt")
    assert a.text(start, 0, 50) == b.text(start, 0, 50)
    assert PseudoText(seed=8).text(start, 0, 50) != a.text(start, 0, 50)
    rng = random.Random(3)
    for _ in range(100):
        first, count = rng.randint(0, 20000), rng.randint(0, 20000)
        assert count_tokens(a.text(start, first, count)) == count


def test_pseudo_text_chunks_concatenate() -> None:
    text = PseudoText(seed=0)
    whole = text.text(5, 0, 30)
    assert text.text(5, 0, 10) + text.text(5, 10, 3) + text.text(5, 13, 17) == whole


def test_shared_words_are_one_token_each_and_unique() -> None:
    assert all(count_tokens(word) == 1 for word in ONE_TOKEN_WORDS)
    assert len(set(ONE_TOKEN_WORDS)) == len(ONE_TOKEN_WORDS)


def test_seeded_text_and_prompts_are_pinned() -> None:
    # The word list and the rule moved to `tokencount`; a seed must keep giving the same bytes.
    assert zlib.crc32(PseudoText(seed=0).text(0, 0, 8192).encode()) == 2341596212
    assert zlib.crc32(PromptFactory(64, 8, seed=0).next().prompt.encode()) == 38210480


def test_token_ids_follow_the_count_rule_and_equal_text_gives_equal_ids() -> None:
    text = "the tokenizer  of\tmany   words"
    assert len(vocab.encode(text)) == count_tokens(text) == 8
    assert vocab.encode(text) == vocab.encode(text.replace("  ", " "))
    assert vocab.encode("the sea") != vocab.encode("the see")
    assert vocab.decode(vocab.encode(" the sea")) == " the sea"


def test_pseudo_text_ids_are_the_ids_of_its_text() -> None:
    text = PseudoText(seed=3)
    for start, first, count in ((0, 0, 40), (8000, 150, 500), (17, 0, 9000)):
        assert text.token_ids(start, first, count) == vocab.encode(text.text(start, first, count))


def test_chat_prompt_is_templated_and_counted_as_before() -> None:
    messages = [("system", "be brief"), ("user", "what is the tokenizer")]
    ids = chat_prompt_ids(messages)
    assert len(ids) == count_chat_tokens(text for _, text in messages)
    header = [vocab.START_HEADER_ID, vocab.role_id("user"), vocab.END_HEADER_ID]
    assert ids[: len(header)] != header  # the system message comes first, with its own role token
    assert ids[-3:] == [vocab.START_HEADER_ID, vocab.role_id("assistant"), vocab.END_HEADER_ID]
    assert ids.count(vocab.END_OF_TURN_ID) == 2


def test_a_finished_turn_is_a_prefix_of_the_next_turns_prompt() -> None:
    text = PseudoText(seed=0)
    turn1 = [("user", "tell me about the sea")]
    prompt1 = chat_prompt_ids(turn1)
    answer = text.text(text.start_for("tell me about the sea"), 0, 30)
    output = text.token_ids(text.start_for("tell me about the sea"), 0, 30)
    prompt2 = chat_prompt_ids([*turn1, ("assistant", answer), ("user", "and the land")])
    assert prompt2[: len(prompt1) + len(output)] == prompt1 + output
    assert prompt2[len(prompt1) + len(output)] == vocab.END_OF_TURN_ID  # the template tail the model never wrote
