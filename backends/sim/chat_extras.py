"""Chat answers for OpenAI's extras, in SGLang's shapes: tool calls, JSON output, logprobs, and choice `index`.

The simulated model's timing is the engine's as for any request; what changes is the text its
tokens spell. With `tool_choice` "required" or naming a function (and `tools` given), the answer
is one call of that function (the first tool for "required"): streamed as SGLang streams it, a
`tool_calls` delta with the call's id and name and empty arguments, then the arguments' text in
`tool_calls` deltas, and `finish_reason: "tool_calls"`. With `response_format` of type
`json_schema` (or `json_object`) the content is a JSON object matching the schema. Either text
is spread over the engine's chunks in proportion to the words they carry, and sent whole at the
end, however few tokens the request had (SGLang would cut it at `max_tokens`). With `logprobs`,
each chunk (and the whole message) carries `logprobs.content`: one entry per word-like piece,
with `top_logprobs` alternatives.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import orjson

from backends.sim.protocol import ChatCompletionRequest
from backends.sim.render import chat_completion

_END = b"\n\n"
_PIECES = re.compile(r"\s*\S+|\s+")


def wants_extras(body: ChatCompletionRequest) -> bool:
    """True when the plain chat renderer cannot answer `body`: it needs this module's renderer."""
    return body.n != 1 or body.logprobs or forced_tool(body) is not None or json_schema(body) is not None


def forced_tool(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """The function a tool call must call: the named one, or the first with "required"; else None."""
    tools = [t.get("function") or {} for t in body.tools or [] if t.get("type", "function") == "function"]
    choice = body.tool_choice
    if not tools or choice in (None, "auto", "none"):
        return None
    if choice == "required":
        return tools[0]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        return next((t for t in tools if t.get("name") == name), None)
    return None


def json_schema(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """The schema the content must match when `response_format` asks for JSON, else None."""
    fmt = body.response_format or {}
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    return None


def example_of(schema: dict[str, Any]) -> Any:
    """A small value matching `schema` (types, enums, consts, required properties, arrays)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example_of(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: example_of(sub) for name, sub in props.items()}
    if kind == "array":
        return [example_of(schema.get("items") or {"type": "string"})] * max(int(schema.get("minItems") or 1), 1)
    return {"string": "sim", "integer": 1, "number": 1.5, "boolean": True, "null": None}.get(kind, "sim")


def _logprob_entry(piece: str, rank: int, top: int) -> dict[str, Any]:
    """The entry of one generated piece: its logprob, and `top` alternatives led by itself."""
    logprob = -0.05 * (rank % 7 + 1)
    alternatives = [
        {"token": piece + "~" * i, "bytes": list((piece + "~" * i).encode()), "logprob": logprob - 0.5 * i}
        for i in range(top)
    ]
    return {"token": piece, "bytes": list(piece.encode()), "logprob": logprob, "top_logprobs": alternatives}


class ExtrasChatRenderer:
    """`/v1/chat/completions` responses with the extras above, for choice `index` of a request."""

    done = b"data: [DONE]\n\n"
    stream_content_type = b"text/event-stream; charset=utf-8"

    def __init__(self, rid: str, created: int, model: str, body: ChatCompletionRequest, index: int = 0) -> None:
        self.rid, self.created, self.model, self.index = rid, created, model, index
        self._tool = forced_tool(body)
        schema = json_schema(body)
        if self._tool is not None:
            params = self._tool.get("parameters") or {"type": "object"}
            self._target: str | None = orjson.dumps(example_of(params)).decode()
        elif schema is not None:
            self._target = orjson.dumps(example_of(schema)).decode()
        else:
            self._target = None
        self._call_id = f"call_{uuid.uuid4().hex[:24]}"
        self._logprobs = body.logprobs
        self._top = body.top_logprobs or 0
        self._sent = 0  # characters of the target sent so far
        self._ranks = 0

    def _chunk(self, delta: dict[str, Any], text: str, finish: str | None = None, matched: Any = None) -> bytes:
        choice = {
            "index": self.index,
            "delta": delta,
            "logprobs": self._logprobs_of(text),
            "finish_reason": finish,
            "matched_stop": matched,
        }
        head = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + _END

    def _logprobs_of(self, text: str) -> dict[str, Any] | None:
        if not self._logprobs or not text:
            return None
        entries = []
        for piece in _PIECES.findall(text):
            entries.append(_logprob_entry(piece, self._ranks, self._top))
            self._ranks += 1
        return {"content": entries}

    def _take(self, text: str, final: bool) -> str:
        """The next part of the target: as many characters as `text` has, or all that is left."""
        assert self._target is not None
        end = len(self._target) if final else min(self._sent + len(text), len(self._target))
        part = self._target[self._sent : end]
        self._sent = end
        return part

    def _delta(self, text: str, final: bool) -> tuple[dict[str, Any], str]:
        if self._target is None:
            return {"content": text}, text
        if self._tool is None:
            part = self._take(text, final)
            return {"content": part}, part
        first = self._sent == 0
        part = self._take(text, final)
        call: dict[str, Any] = {"index": 0, "function": {"arguments": part}}
        if first:
            call = {"id": self._call_id, "index": 0, "type": "function", "function": {"name": self._tool.get("name"), "arguments": part}}
        return {"tool_calls": [call]}, part

    def opening(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""}, "")

    def content(self, text: str) -> bytes:
        delta, sent = self._delta(text, final=False)
        return self._chunk(delta, sent) if sent or self._target is None else b""

    def _reason(self, reason: str, matched: Any) -> tuple[str, Any]:
        if self._tool is not None and reason == "stop":
            return "tool_calls", None
        return reason, matched

    def ending(self, text: str, reason: str, matched_stop: str | int | None) -> bytes:
        body = b""
        if text or (self._target is not None and self._sent < len(self._target)):
            delta, sent = self._delta(text, final=True)
            body = self._chunk(delta, sent)
        reason, matched = self._reason(reason, matched_stop)
        return body + self._chunk({}, "", reason, matched)

    def usage(self, usage: dict[str, Any]) -> bytes:
        head = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model}
        return b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + _END

    def choice(self, text: str, reason: str, matched_stop: str | int | None) -> dict[str, Any]:
        """The whole answer as one element of a non-streamed response's `choices`."""
        content: str | None = text if self._target is None else self._target
        tool_calls = None
        if self._tool is not None:
            call = {"name": self._tool.get("name"), "arguments": self._target}
            tool_calls = [{"id": self._call_id, "index": 0, "type": "function", "function": call}]
            content = None
        reason, matched = self._reason(reason, matched_stop)
        return {
            "index": self.index,
            "message": {"role": "assistant", "content": content, "reasoning_content": None, "tool_calls": tool_calls},
            "logprobs": self._logprobs_of(content or self._target or ""),
            "finish_reason": reason,
            "matched_stop": matched,
        }

    def complete(self, text: str, reason: str, matched_stop: str | int | None, usage: dict[str, Any]) -> bytes:
        return chat_completion(self.rid, self.created, self.model, self.choice(text, reason, matched_stop), usage)
