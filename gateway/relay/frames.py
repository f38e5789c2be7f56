"""A relay for streams framed otherwise than OpenAI's `data:` SSE (the Responses API's events, Ollama's NDJSON).

Each frame ending in the dialect's separator is forwarded as the backend sent it and read once, by
the dialect's `Inspect`, to see which frames carry tokens (TTFT/ITL), where the stream ends and what
usage it reports (in the chat shape, `prompt_tokens`/`completion_tokens`, that the proxy counts).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Send

from gateway.errors import OpenAIError
from gateway.relay import StreamResult
from gateway.relay.idle_watch import IdleWatch
from gateway.upstream.errors import WireError
from gateway.upstream.http11 import WireResponse

SSE_SEPARATOR = b"\n\n"
LINE = b"\n"


class Frame(enum.Enum):
    """What one frame of a stream is, as far as the relay cares."""

    OTHER = "other"  # forwarded, nothing to note
    TOKENS = "tokens"  # carries generated text
    ERROR = "error"  # the backend reports a failure in-stream; forwarded
    END = "end"  # the last frame of a finished stream; forwarded
    FAILED_END = "failed_end"  # the last frame, saying the response failed; forwarded
    MALFORMED = "malformed"  # not what the backend sends: never forwarded


Inspect = Callable[[bytes], tuple[Frame, dict[str, Any] | None]]


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
    watch = IdleWatch(idle_timeout)  # one timer per stream, not an `asyncio.timeout` per frame
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
