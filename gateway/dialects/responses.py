"""The Responses API: typed SSE events (an `event:` line before each `data:` line, no `[DONE]`).

A stream ends with its terminal `response.completed`/`incomplete`/`failed` event, whose
`response.usage` counts `input_tokens`/`output_tokens`; a gateway failure inside a stream is an
`error` event the openai SDK raises on. The body's output limit is `max_output_tokens`.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Send

from gateway.dialects.openai import Body, BodyOnlyModel, positive_int
from gateway.edge.body_writer import BodyWriter
from gateway.errors import OpenAIError
from gateway.relay import StreamResult
from gateway.relay.frames import LINE, SSE_SEPARATOR, Frame, relay_frames
from gateway.upstream.http11 import WireResponse

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """The Responses API's usage (`input_tokens`, `output_tokens`, cached input) in the chat shape."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    counts: dict[str, Any] = {
        "prompt_tokens": int(usage.get("input_tokens") or 0),
        "completion_tokens": int(usage.get("output_tokens") or 0),
    }
    if isinstance(cached, int):
        counts["prompt_tokens_details"] = {"cached_tokens": cached}
    return counts


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


def responses_stream_error(err: OpenAIError) -> bytes:
    """A gateway failure inside a Responses stream: an `error` event the openai SDK raises on."""
    return b"event: error\n" + err.sse_event()


class ResponsesDialect(BodyOnlyModel):
    """The Responses API: typed SSE events, usage as `input_tokens`/`output_tokens`."""

    def max_tokens(self, body: Body) -> int | None:
        value = body.get("max_output_tokens")
        return value if positive_int(value) else None

    def prompt_text(self, body: Body) -> bytes | None:
        """Instructions, then the input (text, or its items as JSON); a follow-up is pinned, not keyed."""
        given = body.get("input")
        text = given if isinstance(given, str) else orjson.dumps(given, option=orjson.OPT_SORT_KEYS).decode()
        return f"\x1e{body.get('instructions') or ''}\x1f{text}".encode("utf-8", "surrogatepass")

    def usage(self, response: Any) -> Body | None:
        return responses_usage(response.get("usage"))

    async def relay(self, resp: WireResponse, send: Send, *, strip_usage: bool, writer: BodyWriter | None = None, **options: Any) -> StreamResult:
        # `strip_usage` is moot: the usage is part of the last event, which the client gets whole.
        # The frames are awaited and sent one by one (`writer` is for the OpenAI streams, the hot path).
        return await relay_frames(
            resp, send, separator=SSE_SEPARATOR, inspect=inspect_responses_event, on_error=self.stream_error, **options
        )

    def stream_error(self, err: OpenAIError) -> bytes:
        return responses_stream_error(err)


RESPONSES = ResponsesDialect()
