"""What differs between the generation APIs the proxy carries.

A `Dialect` says, for one API family: where a body names its output limit (the policy's expected
length), what the gateway adds before forwarding it, where a whole response keeps its token
counts, how a stream is relayed (its content type, its framing, where it ends and what usage it
reports) and how errors reach the client. `OPENAI` is chat and text completions (SSE `data:`
events ending in `[DONE]`); `RESPONSES` the Responses API (typed SSE events, no `[DONE]`);
`OLLAMA` Ollama's routes (NDJSON); `gateway/native.py` has SGLang's `/generate`.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from gateway.body_writer import BodyWriter
from gateway.errors import OpenAIError, upstream_error
from gateway.relay import DONE, ChunkReader, StreamResult, read_openai_chunk, relay_stream
from gateway.stream_dialects import (
    ollama_stream_error,
    ollama_usage,
    LINE,
    SSE_SEPARATOR,
    inspect_ollama_line,
    inspect_responses_event,
    relay_frames,
    responses_stream_error,
    responses_usage,
)
from gateway.wire import WireResponse

Body = dict[str, Any]
_SSE = b"text/event-stream; charset=utf-8"


def positive_int(value: Any) -> bool:
    """Whether `value` is an int above zero (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class Dialect:
    """OpenAI's chat and text completions, as SGLang serves them; other APIs override what differs."""

    stream_content_type: bytes = _SSE

    def max_tokens(self, body: Body) -> int | None:
        """The client's limit on output tokens per sequence, when it gave one: `max_completion_tokens`, else `max_tokens`."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if positive_int(value):
                return value  # type: ignore[no-any-return]
        return None

    def upstream_body(
        self, body: Body, *, served_model: str | None, stream: bool, client_wants_usage: bool, request_id: str
    ) -> Body:
        """The JSON to send upstream: `model` rewritten, usage asked for, and a `rid` SGLang can abort by."""
        body = dict(body)
        if served_model:
            body["model"] = served_model
        if stream and not client_wants_usage:
            # Token counts come from usage; the extra chunk is stripped from what the client sees.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if "rid" not in body and body.get("n") in (None, 1):
            body["rid"] = request_id  # lets SGLang's /abort_request and logs name this request
        return body

    def usage(self, response: Any) -> Body | None:
        """Token counts (`prompt_tokens`, `completion_tokens`) of a whole decoded response body."""
        if not isinstance(response, dict):
            raise ValueError("not a JSON object")
        return response.get("usage")

    def chunk_reader(self) -> ChunkReader:
        """A reader for one stream's events (it may keep state across them)."""
        return read_openai_chunk

    async def relay(self, resp: WireResponse, send: Send, **options: Any) -> StreamResult:
        """Relay one upstream stream to the client (`relay_stream`'s keyword options)."""
        return await relay_stream(resp, send, read=self.chunk_reader(), **options)

    def stream_error(self, err: OpenAIError) -> bytes:
        """The bytes that end a stream whose headers are already sent."""
        return err.sse_event() + DONE

    def upstream_error(self, status: int, payload: bytes) -> OpenAIError:
        """The error the client gets for an upstream error response."""
        return upstream_error(status, payload)


class _BodyOnlyModel(Dialect):
    """An API whose body the gateway forwards with only `model` rewritten (no usage request, no `rid`)."""

    def upstream_body(
        self, body: Body, *, served_model: str | None, stream: bool, client_wants_usage: bool, request_id: str
    ) -> Body:
        return {**body, "model": served_model} if served_model else dict(body)


class ResponsesDialect(_BodyOnlyModel):
    """The Responses API: typed SSE events, usage as `input_tokens`/`output_tokens`."""

    def max_tokens(self, body: Body) -> int | None:
        value = body.get("max_output_tokens")
        return value if positive_int(value) else None

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


class OllamaDialect(_BodyOnlyModel):
    """Ollama's `/api/chat` and `/api/generate`: NDJSON streams, `options.num_predict`."""

    stream_content_type = b"application/x-ndjson"

    def max_tokens(self, body: Body) -> int | None:
        # Absent, SGLang caps at 2048, but the model usually stops far sooner: no expected length.
        options = body.get("options")
        value = options.get("num_predict") if isinstance(options, dict) else None
        return value if positive_int(value) else None

    def usage(self, response: Any) -> Body | None:
        return ollama_usage(response)

    async def relay(self, resp: WireResponse, send: Send, *, strip_usage: bool, writer: BodyWriter | None = None, **options: Any) -> StreamResult:
        # `strip_usage` is moot: nothing was asked for on the client's behalf; `writer`: as for Responses.
        return await relay_frames(resp, send, separator=LINE, inspect=inspect_ollama_line, on_error=self.stream_error, **options)

    def stream_error(self, err: OpenAIError) -> bytes:
        return ollama_stream_error(err)


OPENAI = Dialect()
RESPONSES = ResponsesDialect()
OLLAMA = OllamaDialect()
