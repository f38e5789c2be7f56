"""The API families the proxy relays, and what it must know of each one's wire format.

Chat and completions stream OpenAI's `data:` SSE ending in `[DONE]`; the Responses API streams
typed SSE events; the Ollama routes stream NDJSON. A `Wire` tells the proxy, for one family, how to
relay a stream, what content type it has, where a whole body reports its token counts, the
request's limit on output tokens (the routing policy's expected length) and whether to ask
SGLang for usage and name the request with `rid` (fields only the OpenAI routes have).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.errors import OpenAIError
from gateway.relay import DONE, StreamResult, relay_stream
from gateway.stream_dialects import (
    ollama_stream_error,
    ollama_usage,
    relay_ollama_stream,
    relay_responses_stream,
    responses_stream_error,
    responses_usage,
)

Body = dict[str, Any]
StreamRelay = Callable[..., Awaitable[StreamResult]]  # relay_stream's signature


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def openai_max_tokens(body: Body) -> int | None:
    """`max_completion_tokens`, else `max_tokens` (SGLang's rule)."""
    for key in ("max_completion_tokens", "max_tokens"):
        if (value := _positive_int(body.get(key))) is not None:
            return value
    return None


def ollama_max_tokens(body: Body) -> int | None:
    """Ollama's `options.num_predict` (absent, SGLang caps at 2048 but the model usually stops far sooner)."""
    options = body.get("options")
    return _positive_int(options.get("num_predict")) if isinstance(options, dict) else None


def _openai_stream_error(err: OpenAIError) -> bytes:
    return err.sse_event() + DONE


@dataclass(frozen=True)
class Wire:
    """One API family's wire format, as the proxy needs it."""

    stream_content_type: bytes
    relay: StreamRelay
    stream_error: Callable[[OpenAIError], bytes]  # ends a stream whose headers are already sent
    usage: Callable[[Body], Body | None]  # token counts of a whole (non-streamed) body, chat-shaped
    max_tokens: Callable[[Body], int | None]
    openai_extras: bool  # ask for the usage chunk and name the request with `rid`


_SSE = b"text/event-stream; charset=utf-8"

OPENAI = Wire(_SSE, relay_stream, _openai_stream_error, lambda body: body.get("usage"), openai_max_tokens, True)
RESPONSES = Wire(
    _SSE,
    relay_responses_stream,
    responses_stream_error,
    lambda body: responses_usage(body.get("usage")),
    lambda body: _positive_int(body.get("max_output_tokens")),
    False,
)
OLLAMA = Wire(b"application/x-ndjson", relay_ollama_stream, ollama_stream_error, ollama_usage, ollama_max_tokens, False)


