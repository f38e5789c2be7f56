"""The OpenAI surface: chat and text completions (proxied), and the model list."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.jobs import CHAT, COMPLETIONS, ProxiedRoute, build_job, check_model, runtime_of, take_tier
from gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from gateway.errors import OpenAIError
from gateway.proxy.exchange import ProxyResponse
from gateway.proxy.job import choices
from gateway.runtime import Runtime
from gateway.tiers import TIER_FIELD

router = APIRouter()

STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A JSON completion, or with `stream: true` an SSE stream of chunks ending in `data: [DONE]`",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


@router.post("/v1/chat/completions", response_class=Response, responses=STREAM_DOC)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    """Create a chat completion on the backend the routing policy picks."""
    return await _proxy(request, CHAT, body.model, body.stream, body.wants_usage)


@router.post("/v1/completions", response_class=Response, responses=STREAM_DOC)
async def completions(request: Request, body: CompletionRequest) -> Response:
    """Create a text completion on the backend the routing policy picks."""
    return await _proxy(request, COMPLETIONS, body.model, body.stream, body.wants_usage)


async def _proxy(request: Request, route: ProxiedRoute, model: str, stream: bool, wants_usage: bool) -> Response:
    rt = runtime_of(request)
    check_model(rt, model)
    body = dict(await request.json())  # already parsed (and cached) by the body validation
    # The tier is specgate's to serve (the response echoes the one served); SGLang's chat and
    # completions take no `service_tier`.
    tier = take_tier(rt, request.scope, body, body.pop(TIER_FIELD, None))
    job = build_job(
        rt, request.scope, route, body,
        stream=stream, client_wants_usage=wants_usage, weight=choices(body), tier=tier, echo_tier=tier is not None,
    )
    return ProxyResponse(rt, job)


def _cards(rt: Runtime) -> list[dict[str, Any]]:
    rt.pool.sync()
    backend = next((b for b in rt.pool if b.model_card is not None), None)
    if backend is None:
        raise OpenAIError(503, "no backend has reported its model yet", code="no_backend_available", type="server_error")
    card = backend.model_card or {}
    public = rt.settings.server.model_name or backend.served_model_name
    return [{**card, "id": public, "object": "model", "owned_by": "specgate"}]


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The model served behind the gateway, in OpenAI's list format."""
    return {"object": "list", "data": _cards(runtime_of(request))}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    """One model card; 404 for an unknown id."""
    rt = runtime_of(request)
    cards = _cards(rt)
    if model_id not in rt.model_ids():
        raise OpenAIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return {**cards[0], "id": model_id}
