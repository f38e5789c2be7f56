"""Ollama's `/api/chat` and `/api/generate`: NDJSON streams ending with `"done": true`.

Counts are `prompt_eval_count`/`eval_count` where the server gives them (SGLang's streamed chunks
carry none); the body's output limit is `options.num_predict`; a gateway failure inside a stream is
Ollama's `{"error": "..."}` line.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Send

from gateway.dialects.openai import Body, BodyOnlyModel, messages_text, positive_int
from gateway.edge.body_writer import BodyWriter
from gateway.errors import OpenAIError
from gateway.relay import StreamResult
from gateway.relay.frames import LINE, Frame, relay_frames
from gateway.upstream.http11 import WireResponse


def ollama_usage(body: dict[str, Any]) -> dict[str, Any] | None:
    """Ollama's counts (`prompt_eval_count`, `eval_count`) in the chat shape; None when it gave none."""
    if body.get("eval_count") is None and body.get("prompt_eval_count") is None:
        return None
    return {
        "prompt_tokens": int(body.get("prompt_eval_count") or 0),
        "completion_tokens": int(body.get("eval_count") or 0),
    }


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


def ollama_stream_error(err: OpenAIError) -> bytes:
    """A gateway failure inside an Ollama stream: Ollama's `{"error": "..."}` line."""
    return orjson.dumps({"error": err.message}) + LINE


class OllamaDialect(BodyOnlyModel):
    """Ollama's `/api/chat` and `/api/generate`: NDJSON streams, `options.num_predict`."""

    stream_content_type = b"application/x-ndjson"

    def max_tokens(self, body: Body) -> int | None:
        # Absent, SGLang caps at 2048, but the model usually stops far sooner: no expected length.
        options = body.get("options")
        value = options.get("num_predict") if isinstance(options, dict) else None
        return value if positive_int(value) else None

    def prompt_text(self, body: Body) -> bytes | None:
        """`/api/chat`'s messages as chat's are keyed; `/api/generate`'s system prompt and prompt."""
        if "messages" in body:
            return messages_text(body["messages"])
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        return f"\x1esystem\x1f{body.get('system') or ''}\x1euser\x1f{prompt}".encode("utf-8", "surrogatepass")

    def usage(self, response: Any) -> Body | None:
        return ollama_usage(response)

    async def relay(self, resp: WireResponse, send: Send, *, strip_usage: bool, writer: BodyWriter | None = None, **options: Any) -> StreamResult:
        # `strip_usage` is moot: nothing was asked for on the client's behalf; `writer`: as for Responses.
        return await relay_frames(resp, send, separator=LINE, inspect=inspect_ollama_line, on_error=self.stream_error, **options)

    def stream_error(self, err: OpenAIError) -> bytes:
        return ollama_stream_error(err)


OLLAMA = OllamaDialect()
