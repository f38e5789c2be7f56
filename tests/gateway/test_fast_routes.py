"""The proxied routes' fast path agrees with the full FastAPI route it stands in for."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from gateway.api.fast_path import FastProxyRoutes
from gateway.api.schemas import ChatCompletionRequest, CompletionRequest, surely_valid
from gateway.relay.sse import _carries_tokens, tokens_by_bytes
from tests.gateway.test_edge import make_runtime

MSG = [{"role": "user", "content": "hi"}]
CHAT_BODIES: list[Any] = [
    {"model": "m", "messages": MSG},
    {"model": "m", "messages": MSG, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 9},
    {"model": "m", "messages": [{"role": "system", "content": None}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]},
    {"model": "m", "messages": MSG, "temperature": 2, "top_p": 1.0, "n": 128, "stop": ["a", "b"], "seed": -5, "extra": {"x": 1}},
    {"model": "m", "messages": MSG, "presence_penalty": -2.0, "frequency_penalty": 2, "max_completion_tokens": 0},
    # Invalid (or valid only through pydantic's coercions): the fast path must leave each to the model.
    {"model": "", "messages": MSG},
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
    {"model": "m", "messages": [{"content": "x"}]},
    {"model": "m", "messages": MSG, "max_tokens": -1},
    {"model": "m", "messages": MSG, "max_tokens": "5"},
    {"model": "m", "messages": MSG, "max_tokens": 5.0},
    {"model": "m", "messages": MSG, "stream": "true"},
    {"model": "m", "messages": MSG, "stream": 1},
    {"model": "m", "messages": MSG, "temperature": 2.5},
    {"model": "m", "messages": MSG, "temperature": True},
    {"model": "m", "messages": MSG, "top_p": 0},
    {"model": "m", "messages": MSG, "n": 0},
    {"model": "m", "messages": MSG, "stop": [1]},
    {"model": "m", "messages": MSG, "stream_options": {"include_usage": "yes"}},
    {"model": 3, "messages": MSG},
    {"messages": MSG},
    [],
]
COMPLETION_BODIES: list[Any] = [
    {"model": "m", "prompt": "x"},
    {"model": "m", "prompt": ["x", "y"]},
    {"model": "m", "prompt": [1, 2, 3]},
    {"model": "m", "prompt": [[1, 2], [3]]},
    {"model": "m", "prompt": []},
    {"model": "m", "prompt": [1, "x"]},
    {"model": "m", "prompt": None},
    {"model": "m"},
]


def _pydantic_accepts(model: type, body: Any) -> bool:
    try:
        model.model_validate(body)  # type: ignore[attr-defined]
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    ("endpoint", "model", "body"),
    [("chat", ChatCompletionRequest, b) for b in CHAT_BODIES] + [("completions", CompletionRequest, b) for b in COMPLETION_BODIES],
)
def test_surely_valid_never_accepts_what_the_model_refuses(endpoint: str, model: type, body: Any) -> None:
    assert not surely_valid(endpoint, body) or _pydantic_accepts(model, body)


@pytest.mark.parametrize(("endpoint", "body"), [("chat", b) for b in CHAT_BODIES[:5]] + [("completions", b) for b in COMPLETION_BODIES[:5]])
def test_plain_valid_bodies_take_the_fast_path(endpoint: str, body: Any) -> None:
    assert surely_valid(endpoint, body)


def _event(choice: dict[str, Any] | None = None, **extra: Any) -> bytes:
    obj: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", **extra}
    if choice is not None:
        obj["choices"] = [{"index": 0, **choice}]
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    "payload",
    [
        _event({"delta": {"content": "a"}}),
        _event({"delta": {"content": "a", "reasoning_content": None, "tool_calls": None}}, usage=None),
        _event({"delta": {"reasoning_content": "think"}}),
        _event({"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}),
        _event({"text": " word", "finish_reason": None}),
        _event({"delta": {"content": "\"quoted\\\" \\\"content\\\":\\\"x"}}),
        _event({"delta": {"role": "assistant", "content": ""}}),
        _event({"delta": {}, "finish_reason": "length"}),
        _event({"delta": {"tool_calls": []}}),
        _event({"text": ""}),
        _event(None, usage={"completion_tokens": 3}),
        _event({"delta": {"content": "a"}}, usage={"completion_tokens": 3}),
        orjson.dumps({"error": {"message": "x"}, "choices": [{"delta": {"content": "a"}}]}),
        b'{"choices": [{"delta": {"content": "spaced"}}]}',
        orjson.dumps({"usage": {"completion_tokens": 3}, "choices": [{"delta": {"content": "a"}}], "x": {"usage": None}}),
        orjson.dumps({"id": "x", "choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": 3}}),
    ],
)
def test_token_chunks_recognised_by_bytes_agree_with_a_full_decode(payload: bytes) -> None:
    # The byte check may pass on to the decoder, but when it says "tokens" the decoder must agree,
    # and a chunk with usage or an error is always decoded.
    decoded = orjson.loads(payload)
    event = b"data: " + payload + b"\n\n"
    if tokens_by_bytes(event):
        assert _carries_tokens(decoded) and "error" not in decoded and not decoded.get("usage")
    if payload.startswith(b'{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}'):
        assert tokens_by_bytes(event)


async def _call(middleware: FastProxyRoutes, body: bytes) -> tuple[list[Message], list[bytes]]:
    """POST `body` to /v1/chat/completions through the middleware; what it sent, and what its inner app read."""
    sent: list[Message] = []
    inner_read: list[bytes] = []
    incoming = [{"type": "http.request", "body": body[:5], "more_body": True}, {"type": "http.request", "body": body[5:], "more_body": False}]

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        inner_read.append((await receive())["body"])

    middleware.app = inner
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [(b"content-type", b"application/json")]}
    await middleware(scope, receive, send)
    return sent, inner_read


async def test_a_valid_request_is_served_without_the_router_and_an_invalid_one_is_replayed_to_it() -> None:
    rt = make_runtime()  # no backend is ready: a request the fast path serves gets the proxy's 503
    middleware = FastProxyRoutes(None, rt)  # type: ignore[arg-type]
    valid = orjson.dumps({"model": "m", "messages": MSG, "max_tokens": 4})
    sent, inner_read = await _call(middleware, valid)
    assert inner_read == [] and sent[0]["status"] == 503
    invalid = orjson.dumps({"model": "m", "messages": MSG, "max_tokens": "4"})
    sent, inner_read = await _call(middleware, invalid)
    assert inner_read == [invalid] and sent == []
    unknown_model = orjson.dumps({"model": "other", "messages": MSG})
    assert (await _call(middleware, unknown_model))[1] == [unknown_model]


async def test_a_client_gone_before_its_body_was_read_counts_as_gone() -> None:
    rt = make_runtime()
    middleware = FastProxyRoutes(None, rt)  # type: ignore[arg-type]
    inner_called: list[Scope] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        inner_called.append(scope)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        raise AssertionError(f"nothing may be sent to a client that left: {message}")

    middleware.app = inner
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [(b"content-type", b"application/json")]}
    before = rt.metrics.requests.labels("none", "chat", "499")._value.get()
    await middleware(scope, receive, send)
    assert inner_called == []
    assert rt.metrics.requests.labels("none", "chat", "499")._value.get() == before + 1


def test_sglang_token_chunks_take_the_byte_path() -> None:
    # SGLang's layout: every chunk ends with a null usage; a token chunk must not need a decode.
    chunk = orjson.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": None, "content": "a"}}], "usage": None})
    assert tokens_by_bytes(b"data: " + chunk + b"\n\n")
    assert not tokens_by_bytes(b"data: " + chunk.replace(b'"content":"a"', b'"content":""') + b"\n\n")
