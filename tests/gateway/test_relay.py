"""The SSE relay against a scripted upstream: bytes pass through untouched, failures end cleanly."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.relay import DONE, relay_stream
from gateway.wire import WireResponse


def event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(text: str, **extra: Any) -> bytes:
    return event({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}], **extra})


ROLE = event({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
FINISH = event({"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
USAGE = event({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})


async def run_relay(resp: WireResponse, *, strip_usage: bool, idle: float = 5.0) -> tuple[bytes, Any, list[float], int]:
    sent: list[bytes] = []
    gaps: list[float] = []
    firsts = 0

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    def on_token(now: float, first: bool) -> None:
        nonlocal firsts
        firsts += first

    result = await relay_stream(resp, send, strip_usage=strip_usage, idle_timeout=idle, on_token=on_token, on_gap=gaps.append)
    resp.close()
    return b"".join(sent), result, gaps, firsts


async def test_bytes_are_relayed_untouched_and_usage_is_read(upstream) -> None:  # type: ignore[no-untyped-def]
    parts = [ROLE, chunk("a"), chunk("bc d") + chunk("e"), FINISH, USAGE, DONE]
    out, result, gaps, firsts = await run_relay(await upstream(parts), strip_usage=False)
    assert out == b"".join(parts)
    assert result.error_kind is None
    assert result.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert result.token_chunks == 3 and firsts == 1 and len(gaps) == 2  # role and finish chunks carry no tokens


async def test_usage_chunk_is_stripped_when_the_client_did_not_ask(upstream) -> None:  # type: ignore[no-untyped-def]
    parts = [chunk("a"), FINISH, USAGE, DONE]
    out, result, _, _ = await run_relay(await upstream(parts), strip_usage=True)
    assert out == chunk("a") + FINISH + DONE
    assert result.usage is not None and result.usage["completion_tokens"] == 3


async def test_event_split_across_writes_is_reassembled(upstream) -> None:  # type: ignore[no-untyped-def]
    whole = chunk("hello")
    out, result, _, _ = await run_relay(await upstream([whole[:7], whole[7:20], whole[20:], DONE]), strip_usage=True)
    assert out == whole + DONE and result.token_chunks == 1


@pytest.mark.parametrize(
    ("parts", "kind"),
    [
        ([chunk("a")], "truncated"),
        ([chunk("a"), b"data: {\"choi"], "truncated"),
        ([chunk("a"), b"data: not json\n\n", chunk("b"), DONE], "malformed_event"),
        ([b"data: [1, 2]\n\n"], "malformed_event"),
    ],
)
async def test_broken_streams_end_with_an_error_event_and_done(upstream, parts: list[bytes], kind: str) -> None:  # type: ignore[no-untyped-def]
    out, result, _, _ = await run_relay(await upstream(parts), strip_usage=True)
    assert result.error_kind == kind
    assert out.startswith(chunk("a")) or kind == "malformed_event"
    assert b"not json" not in out  # garbage never reaches the client
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2][len(b"data: "):])
    assert error["error"]["code"] == kind and error["error"]["type"] == "server_error"


async def test_upstream_error_event_is_passed_on(upstream) -> None:  # type: ignore[no-untyped-def]
    err = event({"error": {"message": "The request queue is full.", "type": "Service Unavailable", "code": 503}})
    out, result, _, _ = await run_relay(await upstream([chunk("a"), err, DONE]), strip_usage=True)
    assert out == chunk("a") + err + DONE
    assert result.error_kind == "stream_error"


async def test_silent_upstream_hits_the_idle_timeout(upstream) -> None:  # type: ignore[no-untyped-def]
    out, result, _, _ = await run_relay(await upstream([chunk("a")], hang=True), strip_usage=True, idle=0.2)
    assert result.error_kind == "idle_timeout"
    assert out.endswith(DONE) and b"idle_timeout" in out
