"""Relays for the streams that are not OpenAI's `data:` SSE: Responses API events and Ollama's NDJSON.

Both forward each frame's bytes as the backend sent them and read each frame once, like
`gateway/relay.py`: to see which frames carry tokens (TTFT/ITL), where the stream ends and what
usage it reports. A Responses stream is SSE with an `event:` line before each `data:` line and no
`[DONE]`: it ends with its terminal `response.completed`/`incomplete`/`failed` event, whose
`response.usage` counts `input_tokens`/`output_tokens`. An Ollama stream is one JSON object per line
ending with `"done": true` (counts in `prompt_eval_count`/`eval_count` where the server gives them;
SGLang's streamed chunks carry none). Usage is handed back in the chat shape
(`prompt_tokens`/`completion_tokens`) the proxy counts.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import Send

from gateway.errors import OpenAIError
from gateway.idle_watch import IdleWatch
from gateway.relay import StreamResult
from gateway.wire import WireError, WireResponse

SSE_SEPARATOR = b"\n\n"
LINE = b"\n"
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class Frame(enum.Enum):
    """What one frame of a stream is, as far as the relay cares."""

    OTHER = "other"  # forwarded, nothing to note
    TOKENS = "tokens"  # carries generated text
    ERROR = "error"  # the backend reports a failure in-stream; forwarded
    END = "end"  # the last frame of a finished stream; forwarded
    FAILED_END = "failed_end"  # the last frame, saying the response failed; forwarded
    MALFORMED = "malformed"  # not what the backend sends: never forwarded


Inspect = Callable[[bytes], tuple[Frame, dict[str, Any] | None]]


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """The Responses API's usage (`input_tokens`, `output_tokens`) in the chat shape."""
    if not isinstance(usage, dict):
        return None
    return {
        "prompt_tokens": int(usage.get("input_tokens") or 0),
        "completion_tokens": int(usage.get("output_tokens") or 0),
    }


def ollama_usage(body: dict[str, Any]) -> dict[str, Any] | None:
    """Ollama's counts (`prompt_eval_count`, `eval_count`) in the chat shape; None when it gave none."""
    if body.get("eval_count") is None and body.get("prompt_eval_count") is None:
        return None
    return {
        "prompt_tokens": int(body.get("prompt_eval_count") or 0),
        "completion_tokens": int(body.get("eval_count") or 0),
    }


def inspect_responses_event(frame: bytes) -> tuple[Frame, dict[str, Any] | None]:
    """Classify one SSE event of a Responses stream (its `event:` line is ignored, `type` says it all)."""
    data = b"".join(line[5:].strip() for line in frame.split(LINE) if line.startswith(b"data:"))
    if not data:
        return Frame.OTHER, None
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return Frame.MALFORMED, None
    if not isinstance(event, dict):
        return Frame.MALFORMED, None
    kind = event.get("type")
    if kind in _TERMINAL:
        response = event.get("response")
        usage = responses_usage(response.get("usage")) if isinstance(response, dict) else None
        return (Frame.FAILED_END if kind == "response.failed" else Frame.END), usage
    if kind == "error" or (kind is None and "error" in event):
        return Frame.ERROR, None
    if isinstance(kind, str) and kind.endswith(".delta"):
        return Frame.TOKENS, None
    return Frame.OTHER, None


def inspect_ollama_line(frame: bytes) -> tuple[Frame, dict[str, Any] | None]:
    """Classify one line of an Ollama NDJSON stream."""
    if not frame.strip():
        return Frame.OTHER, None
    try:
        chunk = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return Frame.MALFORMED, None
    if not isinstance(chunk, dict):
        return Frame.MALFORMED, None
    if "error" in chunk:
        return Frame.ERROR, None
    if chunk.get("done"):
        return Frame.END, ollama_usage(chunk)
    message = chunk.get("message")
    text = chunk.get("response") or (message.get("content") or message.get("thinking") if isinstance(message, dict) else None)
    return (Frame.TOKENS if text else Frame.OTHER), None


def responses_stream_error(err: OpenAIError) -> bytes:
    """A gateway failure inside a Responses stream: an `error` event the openai SDK raises on."""
    return b"event: error\n" + err.sse_event()


def ollama_stream_error(err: OpenAIError) -> bytes:
    """A gateway failure inside an Ollama stream: Ollama's `{"error": "..."}` line."""
    return orjson.dumps({"error": err.message}) + LINE


async def relay_frames(
    resp: WireResponse,
    send: Send,
    *,
    separator: bytes,
    inspect: Inspect,
    on_error: Callable[[OpenAIError], bytes],
    idle_timeout: float,
    on_first: Callable[[float], None],
    on_token: Callable[[float], None],
    on_gap: Callable[[float], None],
) -> StreamResult:
    """Relay frames ending in `separator` until the stream's last frame, an error or EOF."""
    result = StreamResult()
    watch = IdleWatch(idle_timeout)  # one timer per stream: an `asyncio.timeout` per frame cost 7.5 us
    loop_time = asyncio.get_running_loop().time
    try:
        while True:
            watch.reading_since = loop_time()
            try:
                frame = await resp.readuntil(separator)
            except asyncio.CancelledError:
                if not watch.timed_out():
                    raise
                result.error_kind = "idle_timeout"
                break
            except ValueError:
                result.error_kind = "malformed_event"
                break
            except (WireError, ConnectionError):
                result.error_kind = "disconnected"
                break
            finally:
                watch.reading_since = None
            if not frame.endswith(separator):
                result.error_kind = "truncated"
                break
            kind, usage = inspect(frame)
            if kind is Frame.MALFORMED:
                result.error_kind = "malformed_event"
                break
            if kind is Frame.TOKENS:
                now = time.monotonic()
                if result.first_token_at is None:
                    result.first_token_at = now
                    on_first(now)
                else:
                    on_gap(now - result.last_token_at)  # type: ignore[operator]
                on_token(now)
                result.last_token_at = now
                result.token_chunks += 1
            elif kind is Frame.ERROR:
                result.error_kind = "stream_error"
            elif kind in (Frame.END, Frame.FAILED_END):
                result.usage = usage
                if kind is Frame.FAILED_END:
                    result.error_kind = "stream_error"
                await send({"type": "http.response.body", "body": frame, "more_body": True})
                return result
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    finally:
        watch.close()
    failure = OpenAIError(502, f"upstream stream failed: {result.error_kind}", code=result.error_kind)
    await send({"type": "http.response.body", "body": on_error(failure), "more_body": True})
    return result
