"""Wire bytes of one response, with everything that does not change between chunks encoded once.

Shapes follow SGLang's OpenAI layer: a chat stream opens with a `{"role": "assistant", "content": ""}`
delta, carries text in `content` deltas, ends with an empty delta holding `finish_reason` and
`matched_stop`, then (with `stream_options.include_usage`) a `choices: []` usage chunk and
`data: [DONE]`. A completions stream puts `finish_reason` on its last text chunk.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

DONE = b"data: [DONE]\n\n"
_END = b"\n\n"
_OPEN_CHOICE = b'"choices":[{"index":0,'
_NO_FINISH = b'"logprobs":null,"finish_reason":null,"matched_stop":null}]'


def _finish(reason: str, matched_stop: str | int | None) -> bytes:
    return (
        b'"logprobs":null,"finish_reason":'
        + orjson.dumps(reason)
        + b',"matched_stop":'
        + orjson.dumps(matched_stop)
        + b"}]"
    )


class Renderer(Protocol):
    """Bytes of a generation response (chat, completions, and the Responses and Ollama APIs)."""

    done: bytes  # what ends a stream after its last event
    stream_content_type: bytes

    def opening(self) -> bytes:
        """Sent ahead of the first text."""
        ...

    def content(self, text: str) -> bytes:
        """One chunk carrying `text`."""
        ...

    def ending(self, text: str, reason: str, matched_stop: str | int | None) -> bytes:
        """The last text (may be empty) and the finish reason."""
        ...

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The usage chunk of a stream."""
        ...

    def complete(self, text: str, reason: str, matched_stop: str | int | None, usage: dict[str, Any]) -> bytes:
        """A whole non-streaming response body."""
        ...


class _Base:
    object_chunk = b""
    done = DONE
    stream_content_type = b"text/event-stream; charset=utf-8"

    def __init__(self, rid: str, created: int, model: str) -> None:
        self.rid = rid
        self.created = created
        self.model = model
        self._head = (
            b'data: {"id":'
            + orjson.dumps(rid)
            + b',"object":'
            + self.object_chunk
            + b',"created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b","
        )

    def usage(self, usage: dict[str, Any]) -> bytes:
        return self._head + b'"choices":[],"usage":' + orjson.dumps(usage) + b"}" + _END


class ChatRenderer(_Base):
    """`/v1/chat/completions` responses."""

    object_chunk = b'"chat.completion.chunk"'

    def __init__(self, rid: str, created: int, model: str) -> None:
        super().__init__(rid, created, model)
        self._content = self._head + _OPEN_CHOICE + b'"delta":{"content":'
        self._content_end = b"}," + _NO_FINISH + b"}" + _END

    def opening(self) -> bytes:
        return self._head + _OPEN_CHOICE + b'"delta":{"role":"assistant","content":""},' + _NO_FINISH + b"}" + _END

    def content(self, text: str) -> bytes:
        return self._content + orjson.dumps(text) + self._content_end

    def ending(self, text: str, reason: str, matched_stop: str | int | None) -> bytes:
        last = self.content(text) if text else b""
        return last + self._head + _OPEN_CHOICE + b'"delta":{},' + _finish(reason, matched_stop) + b"}" + _END

    def complete(self, text: str, reason: str, matched_stop: str | int | None, usage: dict[str, Any]) -> bytes:
        message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason, "matched_stop": matched_stop}
        return chat_completion(self.rid, self.created, self.model, choice, usage)


def chat_completion(rid: str, created: int, model: str, choice: dict[str, Any], usage: dict[str, Any]) -> bytes:
    """A whole (non-streamed) chat completion with one choice, as SGLang writes it."""
    body = {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice]}
    return orjson.dumps({**body, "usage": usage, "metadata": None})


class CompletionRenderer(_Base):
    """`/v1/completions` responses."""

    object_chunk = b'"text_completion"'

    def __init__(self, rid: str, created: int, model: str) -> None:
        super().__init__(rid, created, model)
        self._text = self._head + _OPEN_CHOICE + b'"text":'
        self._text_end = b"," + _NO_FINISH + b',"usage":null}' + _END

    def opening(self) -> bytes:
        return b""

    def content(self, text: str) -> bytes:
        return self._text + orjson.dumps(text) + self._text_end

    def ending(self, text: str, reason: str, matched_stop: str | int | None) -> bytes:
        return self._text + orjson.dumps(text) + b"," + _finish(reason, matched_stop) + b',"usage":null}' + _END

    def complete(self, text: str, reason: str, matched_stop: str | int | None, usage: dict[str, Any]) -> bytes:
        return orjson.dumps(
            {
                "id": self.rid,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched_stop}
                ],
                "usage": usage,
                "metadata": None,
            }
        )
