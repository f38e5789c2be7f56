"""The OpenAI surface: chat and text completions (proxied), and the model list."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.errors import OpenAIError
from gateway.policy import MODE_EAGLE, MODE_PLAIN
from gateway.proxy import ProxyResponse
from gateway.proxy_job import ProxyJob, choices
from gateway.runtime import Runtime
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.tiers import DEFAULT, SGLANG_PRIORITY, TIER_FIELD, TIER_HEADER, Tier, requested_tier

router = APIRouter()

ROUTE_HEADER = "x-specgate-route"
_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A JSON completion, or with `stream: true` an SSE stream of chunks ending in `data: [DONE]`",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


def runtime_of(request: Request) -> Runtime:
    """The gateway runtime serving this request."""
    return request.app.state.runtime  # type: ignore[no-any-return]


@router.post("/v1/chat/completions", response_class=Response, responses=_STREAM_DOC)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    """Create a chat completion on the backend the routing policy picks."""
    return await _proxy(request, body.model, body.stream, body.wants_usage, "chat", "/v1/chat/completions")


@router.post("/v1/completions", response_class=Response, responses=_STREAM_DOC)
async def completions(request: Request, body: CompletionRequest) -> Response:
    """Create a text completion on the backend the routing policy picks."""
    return await _proxy(request, body.model, body.stream, body.wants_usage, "completions", "/v1/completions")


def check_model(rt: Runtime, model: str) -> None:
    """Refuse a model id the gateway does not serve, as OpenAI does (404 `model_not_found`)."""
    known = rt.model_ids()
    if known and model not in known:
        raise OpenAIError(404, f"The model '{model}' does not exist; available: {', '.join(known)}", param="model", code="model_not_found")


async def _proxy(request: Request, model: str, stream: bool, wants_usage: bool, endpoint: str, path: str) -> Response:
    rt = runtime_of(request)
    check_model(rt, model)
    body = dict(await request.json())  # already parsed (and cached) by the body validation
    # The tier is specgate's to serve (the response echoes the one served); SGLang's chat and
    # completions take no `service_tier`.
    tier = take_tier(rt, request, body, body.pop(TIER_FIELD, None))
    job = ProxyJob(
        endpoint=endpoint,
        path=path,
        body=body,
        stream=stream,
        client_wants_usage=wants_usage,
        forced=forced_route(rt, request),
        request_id=uuid.uuid4().hex,
        arrived_at=request.scope.get("state", {}).get("arrived_at", time.monotonic()),
        tier=tier or DEFAULT,
        echo_tier=tier is not None,
        weight=choices(body),
    )
    return ProxyResponse(rt, job)


def take_tier(rt: Runtime, request: Request, body: dict[str, Any], field: object) -> Tier | None:
    """The tier a request asks for (its body's `field`, else the header; None: neither), adding
    SGLang's own `priority` to `body` when the operator enabled SGLang's priority scheduling."""
    tier = requested_tier(field, request.headers.get(TIER_HEADER))
    if rt.settings.policy.tier_sglang_priority and "priority" not in body:
        body["priority"] = SGLANG_PRIORITY[tier or DEFAULT]
    return tier


def forced_route(rt: Runtime, request: Request) -> str | None:
    """The backend or mode the client's route header forces, when the gateway allows that header."""
    if not rt.settings.security.allow_route_header:
        return None
    forced = request.headers.get(ROUTE_HEADER)
    if forced is None:
        return None
    if forced not in rt.pool and forced not in (MODE_EAGLE, MODE_PLAIN):
        raise OpenAIError(
            400,
            f"{ROUTE_HEADER} must name a backend ({', '.join(rt.pool.names)}) or a mode ({MODE_EAGLE}, {MODE_PLAIN})",
            param=ROUTE_HEADER,
            code="invalid_route",
        )
    return forced


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
