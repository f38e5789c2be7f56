"""SGLang's Ollama-compatible routes: `/api/chat` and `/api/generate` routed like chat, `/api/tags`, `/api/show`.

Generation is streamed as Ollama does (newline-delimited JSON, `stream` defaults to true). Like
SGLang, which answers with its served model whatever `model` names, the gateway does not check the
model of these routes. `/api/tags` and `/api/show` need no slot: any ready backend answers them.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.jobs import OLLAMA_CHAT, OLLAMA_GENERATE, ProxiedRoute, build_job, runtime_of
from gateway.api.schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest
from gateway.errors import OpenAIError
from gateway.proxy.exchange import ProxyResponse
from gateway.runtime import Runtime
from gateway.upstream.errors import UPSTREAM_ERRORS

router = APIRouter()

_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A JSON object, or with `stream` (the default) newline-delimited JSON objects ending with `done: true`",
        "content": {"application/json": {}, "application/x-ndjson": {}},
    }
}


async def _proxy(request: Request, route: ProxiedRoute, stream: bool) -> Response:
    rt = runtime_of(request)
    body = dict(await request.json())  # already parsed (and cached) by the body validation
    return ProxyResponse(rt, build_job(rt, request.scope, route, body, stream=stream))


@router.post("/api/chat", response_class=Response, responses=_STREAM_DOC)
async def ollama_chat(request: Request, body: OllamaChatRequest) -> Response:
    """An Ollama chat on the backend the routing policy picks."""
    return await _proxy(request, OLLAMA_CHAT, body.stream)


@router.post("/api/generate", response_class=Response, responses=_STREAM_DOC)
async def ollama_generate(request: Request, body: OllamaGenerateRequest) -> Response:
    """An Ollama completion on the backend the routing policy picks."""
    return await _proxy(request, OLLAMA_GENERATE, body.stream)


async def _from_any_ready(rt: Runtime, path: str, body: bytes | None = None) -> tuple[str, int, bytes, str]:
    """GET (or, with `body`, POST) a small resource from any ready backend, holding no slot."""
    backend = next((b for b in rt.pool if b.available), None)
    if backend is None:
        raise OpenAIError(503, "no backend is ready", code="no_backend_available", type="server_error")
    upstream = rt.upstreams[backend.name]
    try:
        status, payload, content_type = await upstream.fetch(path, body, rt.settings.health.ready_timeout * 5)
    except UPSTREAM_ERRORS as exc:
        raise OpenAIError(502, f"backend {backend.name} did not answer {path}", code="upstream_unreachable", type="server_error") from exc
    return backend.name, status, payload, content_type


@router.get("/api/tags")
async def ollama_tags(request: Request) -> Response:
    """The model list in Ollama's format, from any ready backend, named as `/v1/models` names it."""
    rt = runtime_of(request)
    name, status, payload, content_type = await _from_any_ready(rt, "/api/tags")
    public = rt.settings.server.model_name
    if status == 200 and public:
        payload = _renamed(payload, public)
    return Response(payload, status_code=status, media_type=content_type, headers={"x-specgate-backend": name})


@router.post("/api/show")
async def ollama_show(request: Request, body: OllamaShowRequest) -> Response:
    """SGLang's model details in Ollama's format, from any ready backend."""
    rt = runtime_of(request)
    # Forwarded as it came (validated above): re-encoding could fail where parsing did not (integers past 64 bits).
    name, status, payload, content_type = await _from_any_ready(rt, "/api/show", await request.body())
    return Response(payload, status_code=status, media_type=content_type, headers={"x-specgate-backend": name})


def _renamed(payload: bytes, name: str) -> bytes:
    """An `/api/tags` body with every model called `name` (unchanged when it is not such a body)."""
    try:
        tags = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    models = tags.get("models") if isinstance(tags, dict) else None
    if not isinstance(models, list):
        return payload
    for model in models:
        if isinstance(model, dict):
            model["name"] = model["model"] = name
    return orjson.dumps(tags)
