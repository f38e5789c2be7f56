"""How an answer is handed on to another backend: the continuation body, its token counts, the lower limit."""

from __future__ import annotations

from gateway.dialects.native import NativeDialect
from gateway.dialects.openai import OPENAI
from gateway.dialects.responses import ResponsesDialect

CHAT = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "stream": True, "max_tokens": 50}


def test_a_chat_answer_is_given_back_for_sglang_to_continue() -> None:
    assert OPENAI.continues(CHAT)
    body, original, continued = OPENAI.continuation(CHAT, " once upon")
    assert body["messages"][-1] == {"role": "assistant", "content": " once upon"} and body["continue_final_message"] is True
    assert body["messages"][:-1] == CHAT["messages"] and body["stream"] is True  # the rest as the client sent it
    # Tokenized, the two differ by the given text's tokens.
    assert original == {"model": "m", "messages": CHAT["messages"]}
    assert continued == {"model": "m", "messages": body["messages"], "continue_final_message": True}
    assert OPENAI.with_limit(body, 12)["max_tokens"] == 38 and OPENAI.with_limit(body, 80)["max_tokens"] == 1
    assert OPENAI.with_limit({**body, "max_completion_tokens": 20}, 5)["max_completion_tokens"] == 15


def test_a_completion_goes_on_from_its_prompt_and_text() -> None:
    body = {"model": "m", "prompt": "Once", "max_tokens": 9}
    assert OPENAI.continues(body)
    handed = OPENAI.continuation(body, " upon a")
    assert handed[0]["prompt"] == "Once upon a" and handed[1]["prompt"] == "Once" and handed[2]["prompt"] == "Once upon a"


def test_the_template_options_render_both_counts() -> None:
    body = {**CHAT, "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"}
    _, original, continued = OPENAI.continuation(body, "x")
    for tokenize in (original, continued):
        assert tokenize["chat_template_kwargs"] == {"enable_thinking": False} and tokenize["reasoning_effort"] == "low"


def test_answers_that_cannot_be_handed_on() -> None:
    for body in (
        {**CHAT, "n": 2},
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {**CHAT, "logprobs": True},
        {"model": "m", "prompt": [1, 2, 3]},
        {"model": "m", "prompt": ["a", "b"]},
        {**CHAT, "messages": []},
        {**CHAT, "response_format": {"type": "json_object"}},
        {**CHAT, "regex": "[a-z]+"},
        {**CHAT, "json_schema": "{}"},
    ):
        assert not OPENAI.continues(body)
    assert OPENAI.continues({**CHAT, "response_format": {"type": "text"}})
    assert not ResponsesDialect().continues({"input": "hi"})
    assert not NativeDialect().continues({"text": "hi"})
