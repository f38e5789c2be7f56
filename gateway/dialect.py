"""What differs between the generation APIs the proxy carries: how a body names its output limit,
what the gateway adds before forwarding it, where a response keeps its token counts, and how an
upstream error reaches the client.

`Dialect` is OpenAI's chat and text completions; `gateway/native.py` has SGLang's `/generate`.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import OpenAIError, upstream_error
from gateway.relay import ChunkReader, read_openai_chunk


class Dialect:
    """OpenAI's chat and text completions, as SGLang serves them."""

    def max_tokens(self, body: dict[str, Any]) -> int | None:
        """The client's limit on output tokens per sequence, when it gave one (the policy's expected length)."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if positive_int(value):
                return value  # type: ignore[no-any-return]
        return None

    def upstream_body(
        self, body: dict[str, Any], *, served_model: str | None, stream: bool, client_wants_usage: bool, request_id: str
    ) -> dict[str, Any]:
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

    def usage(self, response: Any) -> dict[str, Any] | None:
        """Token counts (`prompt_tokens`, `completion_tokens`) of a whole decoded response body."""
        if not isinstance(response, dict):
            raise ValueError("not a JSON object")
        return response.get("usage")

    def chunk_reader(self) -> ChunkReader:
        """A reader for one stream's events (it may keep state across them)."""
        return read_openai_chunk

    def upstream_error(self, status: int, payload: bytes) -> OpenAIError:
        """The error the client gets for an upstream error response."""
        return upstream_error(status, payload)


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


OPENAI = Dialect()
