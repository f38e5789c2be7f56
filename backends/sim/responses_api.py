"""SGLang's Responses API (`/v1/responses`, retrieve, cancel), as SGLang 0.5.23 serves it for a plain
(non-harmony) model without tool or reasoning parsers.

SGLang turns a Responses request into a chat request (instructions as the system message, the
stored conversation of `previous_response_id` before the input) and answers with a `response`
object; streamed, with typed SSE events (`event: <type>` then `data: {...}`, numbered by
`sequence_number`, no `[DONE]`): `response.created`, `response.in_progress`, the message item's
`output_item.added`, `content_part.added`, `output_text.delta`s, `output_text.done`,
`content_part.done`, `output_item.done`, and `response.completed` (or `.incomplete` when it hit
`max_output_tokens`, `.failed` when aborted) carrying the whole response with its usage.
Responses are stored (for retrieval and follow-ups) only with `--enable-response-store` and
`store` (true by default), in memory, with no expiry or bound, as in SGLang.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from backends.sim.endpoint import Endpoint
from backends.sim.protocol import CHAT_ROLES, ChatCompletionRequest, ChatMessage, json_response
from backends.sim.request import RequestError, SimRequest
from backends.sim.responses import GenerationResponse, usage_of

_SSE = b"text/event-stream; charset=utf-8"


class ResponsesBody(BaseModel):
    """The fields of SGLang's `ResponsesRequest` the simulation reads or echoes."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    request_id: str = Field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    truncation: str = "disabled"
    user: str | None = None
    metadata: dict[str, Any] | None = None

    def input_messages(self) -> list[tuple[str, str]]:
        """(role, text) of each input item: its string content, or the text of its parts, or a tool output."""
        if isinstance(self.input, str):
            return [("user", self.input)]
        messages = []
        for item in self.input:
            content = item.get("content", item.get("output", ""))
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            role = item.get("role") or ("tool" if item.get("type") == "function_call_output" else "user")
            messages.append((role if role in CHAT_ROLES else "user", str(content or "")))
        return messages


def error(message: str, status: int = HTTPStatus.BAD_REQUEST, param: str | None = None) -> Response:
    """SGLang's nested error of the Responses routes (its `code` is the status number)."""
    err_type = "invalid_request_error"
    return json_response({"error": {"message": message, "type": err_type, "param": param, "code": int(status)}}, status)


def usage_shape(usage: dict[str, Any], cached_tokens: int) -> dict[str, Any]:
    """Chat usage in the Responses shape; SGLang reports cached tokens here without `--enable-cache-report`."""
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def status_of(reason: str | None) -> str:
    """SGLang's response status for a finish reason."""
    return {"length": "incomplete", "abort": "failed", "error": "failed"}.get(reason or "", "completed")


def response_object(
    body: ResponsesBody, model: str, created: int, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    """SGLang's `ResponsesResponse.from_request`, serialized; `usage` in the Responses shape (`usage_shape`)."""
    text = body.text if body.text is not None else ({"format": {"type": "text"}} if output else None)
    return {
        "id": body.request_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "output": output,
        "status": status,
        "usage": usage,
        "parallel_tool_calls": body.parallel_tool_calls,
        "tool_choice": body.tool_choice,
        "tools": body.tools,
        "error": {"code": "server_error", "message": "Generation aborted"} if status == "failed" else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": body.store,
        "temperature": body.temperature,
        "text": text,
        "top_p": body.top_p,
        "truncation": body.truncation,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def _message(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": "final_answer"}


def _text_part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


class ResponseStore:
    """Stored responses and the conversation each one ends (for follow-ups); no expiry, as in SGLang."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.responses: dict[str, dict[str, Any]] = {}
        self.history: dict[str, list[tuple[str, str]]] = {}  # (role, text) of each message
        self.running: dict[str, SimRequest] = {}  # background responses still generating
        self.tasks: set[asyncio.Task[None]] = set()  # their tasks, held so none is collected mid-run

    def keep(self, body: ResponsesBody, response: dict[str, Any], text: str, earlier: list[tuple[str, str]]) -> None:
        """Store `response` unless storing is off or it was cancelled meanwhile."""
        if not (self.enabled and body.store):
            return
        stored = self.responses.get(response["id"])
        if stored is not None and stored["status"] == "cancelled":
            return
        self.responses[response["id"]] = response
        self.history[response["id"]] = [*earlier, *body.input_messages(), ("assistant", text)]


class ResponsesRenderer:
    """Bytes of one response, streamed as typed events or whole; stores it when it ends."""

    done = b""
    stream_content_type = _SSE

    def __init__(
        self, body: ResponsesBody, req: SimRequest, model: str, created: int, on_end: Callable[[dict[str, Any], str], None]
    ) -> None:
        self.body, self.req, self.model, self.created, self._on_end = body, req, model, created, on_end
        self._seq = 0
        self._item = f"msg_{uuid.uuid4().hex}"
        self._text = ""
        self._reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {**fields, "sequence_number": self._seq, "type": kind}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._item, "output_index": 0, "content_index": 0}

    def opening(self) -> bytes:
        return b""  # the opening events come with the first text, so that their numbers come first

    def _open(self) -> bytes:
        if self._seq:
            return b""
        start = response_object(self.body, self.model, self.created, "in_progress", [], None)
        return (
            self._event("response.created", response=start)
            + self._event("response.in_progress", response=start)
            + self._event("response.output_item.added", output_index=0, item=_message(self._item, None, "in_progress"))
            + self._event("response.content_part.added", **self._where(), part=_text_part(""))
        )

    def content(self, text: str) -> bytes:
        if not text:
            return self._open()
        opening = self._open()
        self._text += text
        return opening + self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def ending(self, text: str, reason: str, matched_stop: str | int | None) -> bytes:
        self._reason = reason
        where = self._where()
        return (
            self._open()
            + self.content(text)
            + self._event("response.output_text.done", **where, text=self._text, logprobs=[])
            + self._event("response.content_part.done", **where, part=_text_part(self._text))
            + self._event("response.output_item.done", output_index=0, item=_message(self._item, self._text, "completed"))
        )

    def _final(self, text: str, reason: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        output = [_message(self._item, text, "completed")]
        shaped = usage_shape(usage, self.req.cached_tokens)
        response = response_object(self.body, self.model, self.created, status_of(reason), output, shaped)
        self._on_end(response, text)
        return response

    def usage(self, usage: dict[str, Any]) -> bytes:
        response = self._final(self._text, self._reason, usage)
        return self._event(f"response.{response['status']}", response=response)

    def complete(self, text: str, reason: str, matched_stop: str | int | None, usage: dict[str, Any]) -> bytes:
        return orjson.dumps(self._final(text, reason, usage))


def add_responses_routes(app: FastAPI, ep: Endpoint, store: ResponseStore) -> None:
    """Serve `/v1/responses` and its retrieve and cancel routes on `app`."""

    def disabled(param: str) -> Response:
        return error(
            "Response store is disabled. Stateful Responses require --enable-response-store on a standalone "
            "server; response storage is unavailable in PD mode.",
            param=param,
        )

    def check_id(response_id: str) -> Response | None:
        if not store.enabled:
            return disabled("response_id")
        if not response_id.startswith("resp_"):
            return error(f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.", param="response_id")
        if response_id not in store.responses:
            return error(f"Response with id '{response_id}' not found.", HTTPStatus.NOT_FOUND, "response_id")
        return None

    @app.post("/v1/responses")
    async def create(body: ResponsesBody) -> Response:
        if not store.enabled and body.previous_response_id is not None:
            return disabled("previous_response_id")
        if not store.enabled and body.background:
            return disabled("background")
        if body.background and not body.store:
            return error("background=true requires store=true.", param="store")
        if body.model is not None and body.model != ep.served_model_name:
            return error(f"The model '{body.model}' does not exist", HTTPStatus.NOT_FOUND, "model")
        earlier: list[tuple[str, str]] = []
        if body.previous_response_id is not None:
            if (refused := check_id(body.previous_response_id)) is not None:
                return refused
            earlier = store.history.get(body.previous_response_id, [])
        instructions = [("system", body.instructions)] if body.instructions else []
        messages = instructions + earlier + body.input_messages()
        try:
            chat = ChatCompletionRequest(
                model=ep.served_model_name,
                messages=[ChatMessage(role=r, content=t) for r, t in messages] or [ChatMessage(role="user", content="")],
                max_completion_tokens=body.max_output_tokens,
                stream=body.stream,
                stop=body.stop,
                rid=body.request_id,
            )
        except ValidationError as exc:
            return error(str(exc))
        created = int(time.time())
        renderers: list[ResponsesRenderer] = []

        def renderer(req: SimRequest, model: str) -> ResponsesRenderer:
            made = ResponsesRenderer(body, req, model, created, lambda resp, text: store.keep(body, resp, text, earlier))
            renderers.append(made)
            return made

        try:
            response = ep.start_generation(chat, renderer, include_usage=True)
        except RequestError as exc:
            return error(str(exc))
        # background with stream streams on this connection, as SGLang does
        if not body.background or body.stream or not isinstance(response, GenerationResponse):
            return response
        queued = response_object(body, ep.served_model_name, created, "queued", [], None)
        store.responses[body.request_id] = queued
        req = response.req
        store.running[body.request_id] = req
        task = asyncio.get_running_loop().create_task(_finish_in_background(ep, store, req, renderers[0]))
        store.tasks.add(task)
        task.add_done_callback(store.tasks.discard)
        return json_response(queued)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> Response:
        refused = check_id(response_id)
        return refused if refused is not None else json_response(store.responses[response_id])

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> Response:
        if (refused := check_id(response_id)) is not None:
            return refused
        stored = store.responses[response_id]
        if stored["status"] in ("queued", "in_progress"):
            stored["status"] = "cancelled"
            if (req := store.running.pop(response_id, None)) is not None:
                ep.engine.abort(req)
        return json_response(stored)


async def _finish_in_background(ep: Endpoint, store: ResponseStore, req: SimRequest, renderer: ResponsesRenderer) -> None:
    """Run a background response to its end with no client attached, then store the result."""
    store.responses[req.rid]["status"] = "in_progress"
    try:
        while not req.done:
            await req.event.wait()
            req.event.clear()
    finally:
        store.running.pop(req.rid, None)
    if req.state == "aborted":
        return
    text = ep.engine.text.text(req.text_start, 0, req.produced)
    if req.text_limit is not None:
        text = text[: req.text_limit]
    ep.engine.abort(req)  # frees its engine bookkeeping, as the response object would
    # The Responses shape takes its cached tokens from the request, whatever `--enable-cache-report` says.
    renderer.complete(text, req.finish_reason or "abort", req.matched_stop, usage_of(req, None, cache_report=False))
