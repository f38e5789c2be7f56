"""SGLang's Ollama-compatible routes (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`), as SGLang 0.5.23 serves them.

SGLang maps Ollama's `options` onto its sampling parameters (`num_predict` is `max_new_tokens`,
2048 when absent; `stop`, `seed`, ...), ignores `model` (it answers with its served name) and
`format`, and streams by default: one JSON object per line (`application/x-ndjson`), each with
the new text, then a last line with `done: true`, `done_reason: "stop"` and empty text. As in
SGLang, that last line drops the text of the final engine step and carries no token counts (only
a non-streamed answer has `prompt_eval_count` and `eval_count`), and `done_reason` is "stop"
whatever ended the generation. `/api/generate` with an empty prompt answers at once, generating
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import Response

from backends.sim.endpoint import Endpoint
from backends.sim.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, error_response, json_response
from backends.sim.request import RequestError, SimRequest

_NDJSON = b"application/x-ndjson"
_DEFAULT_MAX_NEW_TOKENS = 2048
_DIGEST = "sha256:sglang0000000000000000000000000000000000000000000000000000000000"


class _OllamaBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    stream: bool = True
    options: dict[str, Any] | None = None

    def option(self, name: str) -> Any:
        return (self.options or {}).get(name)


class OllamaMessage(BaseModel):
    role: str
    content: str


class OllamaChatBody(_OllamaBody):
    messages: list[OllamaMessage]


class OllamaShowBody(BaseModel):
    model: str


class OllamaGenerateBody(_OllamaBody):
    prompt: str
    system: str | None = None


def timestamp() -> str:
    """Ollama's `created_at`: UTC, milliseconds, `Z`."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class OllamaRenderer:
    """Bytes of one Ollama chat or generate answer."""

    done = b""
    stream_content_type = _NDJSON

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat
        self.started_ns = time.time_ns()

    def _text(self, text: str) -> dict[str, Any]:
        if self.chat:
            return {"message": {"role": "assistant", "content": text, "images": None}}
        return {"response": text}

    def _line(self, payload: dict[str, Any]) -> bytes:
        return orjson.dumps(payload) + b"\n"

    def opening(self) -> bytes:
        return b""

    def content(self, text: str) -> bytes:
        return self._line({"model": self.model, "created_at": timestamp(), **self._text(text), "done": False, "done_reason": None})

    def ending(self, text: str, reason: str, matched_stop: str | int | None) -> bytes:
        return self._line({"model": self.model, "created_at": timestamp(), **self._text(""), "done": True, "done_reason": "stop"})

    def usage(self, usage: dict[str, Any]) -> bytes:
        return b""

    def complete(self, text: str, reason: str, matched_stop: str | int | None, usage: dict[str, Any]) -> bytes:
        return orjson.dumps(self.whole(text, usage["prompt_tokens"], usage["completion_tokens"]))

    def whole(self, text: str, prompt_tokens: int | None, completion_tokens: int | None) -> dict[str, Any]:
        """A non-streamed answer."""
        extra = {} if self.chat else {"context": None}
        return {
            "model": self.model,
            "created_at": timestamp(),
            **self._text(text),
            "done": True,
            "done_reason": "stop",
            **extra,
            "total_duration": time.time_ns() - self.started_ns,
            "load_duration": None,
            "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": None,
            "eval_count": completion_tokens,
            "eval_duration": None,
        }


def add_ollama_routes(app: FastAPI, ep: Endpoint) -> None:
    """Serve SGLang's Ollama-compatible routes on `app`."""

    def start(build: Callable[[], ChatCompletionRequest | CompletionRequest], chat: bool) -> Response:
        """Generate for the SGLang request `build` makes of the Ollama one (400 when its options do not fit)."""
        try:
            body = build()
        except (ValidationError, ValueError, TypeError) as exc:
            return error_response(str(exc))

        def renderer(req: SimRequest, model: str) -> OllamaRenderer:
            return OllamaRenderer(ep.served_model_name, chat)

        try:
            return ep.start_generation(body, renderer, include_usage=False)
        except RequestError as exc:
            return error_response(str(exc))

    @app.post("/api/chat")
    async def chat(body: OllamaChatBody) -> Response:
        def build() -> ChatCompletionRequest:
            return ChatCompletionRequest(
                model=ep.served_model_name,
                messages=[ChatMessage(role=m.role, content=m.content) for m in body.messages],
                max_tokens=body.option("num_predict"),
                stop=body.option("stop"),
                stream=body.stream,
            )

        return start(build, chat=True)

    @app.post("/api/generate")
    async def generate(body: OllamaGenerateBody) -> Response:
        prompt = f"{body.system}\n\n{body.prompt}" if body.system else body.prompt
        if not prompt.strip():
            answer = {"model": ep.served_model_name, "created_at": timestamp(), "response": "", "done": True, "done_reason": "stop"}
            answer |= {k: None for k in ("context", "total_duration", "load_duration", "prompt_eval_count")}
            answer |= {k: None for k in ("prompt_eval_duration", "eval_count", "eval_duration")}
            if body.stream:
                return Response(orjson.dumps(answer) + b"\n", media_type=_NDJSON.decode())
            return json_response(answer)
        def build() -> CompletionRequest:
            # Without num_predict the model stops on its own (the profile's default length) within 2048 tokens.
            num_predict = body.option("num_predict")
            return CompletionRequest(
                model=ep.served_model_name,
                prompt=prompt,
                max_tokens=int(num_predict) if num_predict else min(_DEFAULT_MAX_NEW_TOKENS, ep.profile.default_max_tokens),
                stop=body.option("stop"),
                stream=body.stream,
            )

        return start(build, chat=False)

    @app.post("/api/show")
    async def show(body: OllamaShowBody) -> Response:
        family = body.model.split("/")[-1]
        for suffix in ("-Instruct", "-Chat", "-Base"):
            if family.endswith(suffix):
                family = family[: -len(suffix)]
                break
        context = ep.profile.context_length
        details = {
            "parent_model": "",
            "format": "sglang",
            "family": family,
            "families": [family],
            "parameter_size": "unknown",
            "quantization_level": "",
        }
        info = {"general.architecture": family, "general.name": body.model, "general.parameter_count": 0}
        info |= {f"{family}.context_length": context, f"{family}.block_count": 0, f"{family}.embedding_length": 0}
        info[f"{family}.attention.head_count"] = 0
        return json_response(
            {
                "license": "",
                "modelfile": f"FROM {body.model}\nPARAMETER num_ctx {context}\n",
                "parameters": f"num_ctx {context}",
                "template": "",
                "modified_at": timestamp(),
                "details": details,
                "model_info": info,
                "capabilities": ["completion"],
            }
        )

    @app.get("/api/tags")
    async def tags() -> Response:
        name = ep.served_model_name
        family = name.split("/")[-1]
        details = {"format": "sglang", "family": family, "parameter_size": "unknown"}
        model = {"name": name, "model": name, "modified_at": timestamp(), "size": 0, "digest": _DIGEST, "details": details}
        return json_response({"models": [model]})
