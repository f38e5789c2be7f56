"""The Responses API: `POST /v1/responses` routed like chat, and the follow-ups that name a response.

A response SGLang stores lives in the memory of the server that generated it, so everything that
names one (`GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, and a new response's
`previous_response_id`) must reach that server. Unless the client set `request_id` (which SGLang
takes as the response id), the gateway picks the id itself, naming the backend it sends the
request to, so it knows the id before the first byte; it records the backend as soon as that
backend accepts the request (`Runtime.response_homes`, one worker's). An id this worker never saw
and that names no backend (the client's own, made through another worker or before a restart) is
asked for on every ready backend; the one that stores it is its home.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.jobs import RESPONSES_CREATE, build_job, check_model, runtime_of, take_tier
from gateway.api.schemas import ResponsesRequest
from gateway.errors import OpenAIError, upstream_error
from gateway.pool.affinity import ResponseHomes, response_id_for
from gateway.proxy.exchange import ProxyResponse
from gateway.runtime import Runtime
from gateway.tiers import TIER_FIELD
from gateway.upstream.errors import UPSTREAM_ERRORS

router = APIRouter()

_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A response object, or with `stream: true` an SSE stream of typed response events",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


def _not_found(response_id: str, param: str = "response_id") -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", param=param, code="response_not_found")


async def _home(rt: Runtime, response_id: str, param: str = "response_id") -> str:
    """The backend storing `response_id`: remembered, named by the id, or found by asking; else a 404."""
    backend = rt.response_homes.home_of(response_id, rt.pool.names) or await _ask_backends(rt, response_id)
    if backend is None:
        raise _not_found(response_id, param)
    return backend


async def _ask_backends(rt: Runtime, response_id: str) -> str | None:
    """The ready backend that answers GET /v1/responses/{id}, remembered as its home; None if none does."""
    rt.pool.sync()
    names = [b.name for b in rt.pool if b.available]
    path = f"/v1/responses/{quote(response_id, safe='')}"
    answers = await asyncio.gather(
        *(rt.upstreams[name].get(path, rt.settings.health.ready_timeout) for name in names), return_exceptions=True
    )
    for name, answer in zip(names, answers, strict=True):
        if not isinstance(answer, BaseException) and answer[0] == 200:
            rt.response_homes.remember(response_id, name)
            return name
    return None


@router.post("/v1/responses", response_class=Response, responses=_STREAM_DOC)
async def create_response(request: Request, body: ResponsesRequest) -> Response:
    """Create a response on the backend the routing policy picks (a follow-up: where its predecessor is)."""
    rt = runtime_of(request)
    if body.model is not None:
        check_model(rt, body.model)
    home = None if body.previous_response_id is None else await _home(rt, body.previous_response_id, "previous_response_id")
    ids = _NewResponse(rt.response_homes, body.request_id)
    raw = dict(await request.json())  # already parsed (and cached) by the body validation
    # SGLang's Responses API takes `service_tier` itself, so the field travels on unchanged.
    tier = take_tier(rt, request.scope, raw, raw.get(TIER_FIELD))
    job = build_job(
        rt, request.scope, RESPONSES_CREATE, raw,
        stream=body.stream, tier=tier, pinned=home,
        prepare=ids.prepare, on_accepted=ids.accepted if body.store is not False else None,
    )
    return ProxyResponse(rt, job)


class _NewResponse:
    """The id of one new response (the client's `request_id`, else one naming its backend) and its home."""

    def __init__(self, homes: ResponseHomes, given: str | None) -> None:
        self._homes = homes
        self._given = given
        self.response_id = given or ""

    def prepare(self, body: dict[str, Any], backend: str) -> None:
        if self._given is None:
            self.response_id = response_id_for(backend)  # anew on failover: the id names where it went
            body["request_id"] = self.response_id

    def accepted(self, backend: str) -> None:
        self._homes.remember(self.response_id, backend)


async def _at_home(rt: Runtime, response_id: str, path: str, method: str) -> Response:
    """Send a small request about a stored response to its backend; relay the answer."""
    name = await _home(rt, response_id)
    path = path.format(quote(response_id, safe=""))  # an id is one path segment, whatever it holds
    upstream = rt.upstreams[name]
    try:
        body = None if method == "GET" else b"{}"
        status, payload, content_type = await upstream.fetch(path, body, rt.settings.timeouts.first_byte)
    except UPSTREAM_ERRORS as exc:
        raise OpenAIError(
            502, f"backend {name}, which holds response {response_id}, did not answer", code="upstream_unreachable", type="server_error"
        ) from exc
    if status != 200:
        raise upstream_error(status, payload)
    return Response(payload, status_code=200, media_type=content_type, headers={"x-specgate-backend": name})


@router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str) -> Response:
    """A stored response, from the backend that created it; 404 for an id the gateway does not know."""
    return await _at_home(runtime_of(request), response_id, "/v1/responses/{}", "GET")


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Response:
    """Cancel a background response on the backend that runs it."""
    return await _at_home(runtime_of(request), response_id, "/v1/responses/{}/cancel", "POST")
