"""The streaming relay: upstream SSE events to the client, one by one, as they arrive.

Events are forwarded as the exact bytes SGLang sent. Each event is still decoded once (orjson,
~1-2 us for a decode chunk) because the relay must see what it carries: the usage chunk it may have
to strip, an in-stream error, garbage that must not reach the client, and which events carry tokens
(for TTFT/ITL). An SSE library would parse into fields and force re-encoding, so framing is split
here by hand on the blank line that ends every SGLang event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from starlette.types import Send

from gateway.errors import OpenAIError

DONE = b"data: [DONE]\n\n"
_SEPARATOR = b"\n\n"


@dataclass
class StreamResult:
    """What the relay saw of one stream."""

    first_token_at: float | None = None
    last_token_at: float | None = None
    token_chunks: int = 0
    usage: dict[str, Any] | None = None
    error_kind: str | None = None  # None: the stream finished cleanly with [DONE]


def _carries_tokens(chunk: dict[str, Any]) -> bool:
    """True when a chat or completions chunk has generated content (not role/finish-only)."""
    choices = chunk.get("choices")
    if not choices:
        return False
    choice = choices[0]
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(
        delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
    )


def read_openai_chunk(chunk: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """A chat/completions chunk's usage (None if it has none) and whether it carries generated tokens."""
    return chunk.get("usage"), _carries_tokens(chunk)


ChunkReader = Callable[[dict[str, Any]], tuple[dict[str, Any] | None, bool]]


def _data_payload(event: bytes) -> bytes | None:
    """The payload of a single-line `data:` event, or None for comments and other fields."""
    if not event.startswith(b"data:"):
        return None
    return event[5:].strip()


async def relay_stream(
    resp: aiohttp.ClientResponse,
    send: Send,
    *,
    strip_usage: bool,
    idle_timeout: float,
    on_token: Callable[[float, bool], None],
    on_gap: Callable[[float], None],
    read: ChunkReader = read_openai_chunk,
    annotate: Callable[[bytes], bytes] | None = None,
) -> StreamResult:
    """Relay every event of `resp` to `send` until [DONE], an error or EOF.

    Ends the client's stream cleanly in every case: an upstream failure becomes one SSE error
    event followed by [DONE], never a hang or a silent truncation. Does not send the final empty
    body message; the caller does, after its bookkeeping. `on_token(now, first)` is called for each
    event that carries generated tokens, `on_gap(seconds)` with the time since the previous one;
    `annotate`, when given, rewrites each chunk event before it is sent (the service tier's echo).
    `read` tells an event's usage so far and whether it carries tokens (the API's chunk format).
    """
    result = StreamResult()
    reader = resp.content
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                event = await reader.readuntil(_SEPARATOR)
        except TimeoutError:
            result.error_kind = "idle_timeout"
            break
        except ValueError:  # one event larger than the read buffer: not something SGLang sends
            result.error_kind = "malformed_event"
            break
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError):
            result.error_kind = "disconnected"
            break
        if not event.endswith(_SEPARATOR):  # EOF, possibly with half an event: the stream was cut
            result.error_kind = "truncated"
            break
        payload = _data_payload(event)
        if payload is None:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            continue
        if payload == b"[DONE]":
            await send({"type": "http.response.body", "body": event, "more_body": True})
            return result
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            result.error_kind = "malformed_event"
            break
        if not isinstance(chunk, dict):
            result.error_kind = "malformed_event"
            break
        if "error" in chunk:  # SGLang reports aborts mid-stream this way; pass it on, [DONE] follows
            result.error_kind = "stream_error"
            await send({"type": "http.response.body", "body": event, "more_body": True})
            continue
        usage, carries_tokens = read(chunk)
        if usage:
            result.usage = usage
            if not chunk.get("choices") and strip_usage:
                continue  # the usage chunk we asked for on the client's behalf
        if carries_tokens:
            now = time.monotonic()
            first = result.first_token_at is None
            if first:
                result.first_token_at = now
            else:
                on_gap(now - result.last_token_at)  # type: ignore[operator]
            on_token(now, first)
            result.last_token_at = now
            result.token_chunks += 1
        if annotate is not None:
            event = annotate(event)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    failure = OpenAIError(502, f"upstream stream failed: {result.error_kind}", code=result.error_kind)
    await send({"type": "http.response.body", "body": failure.sse_event() + DONE, "more_body": True})
    return result
