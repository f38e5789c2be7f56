"""From an HTTP request to a `ProxyJob`: the one builder every proxied route uses, and the checks it applies.

Each check is defined once and raises the error the client gets: an unknown model (404
`model_not_found`), a route header naming neither a backend nor a mode (400 `invalid_route`), an
unknown service tier (400 `invalid_service_tier`). Every job gets the gateway's request id (the
`x-request-id` header, and the `rid` sent upstream) from `new_request_id`, and the tenant its key
belongs to, whose service-tier ceiling caps the tier it is served as (the response then says so).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.types import Scope

from gateway.dialects.native import NATIVE
from gateway.dialects.ollama import OLLAMA
from gateway.dialects.openai import OPENAI, Dialect
from gateway.dialects.responses import RESPONSES
from gateway.edge.tenants import request_tenant
from gateway.errors import OpenAIError
from gateway.policies import MODE_EAGLE, MODE_PLAIN
from gateway.pool.prefix import PromptKey
from gateway.proxy.job import ProxyJob
from gateway.runtime import Runtime
from gateway.tiers import DEFAULT, SGLANG_PRIORITY, TIER_HEADER, Tier, at_most, requested_tier

ROUTE_HEADER = "x-specgate-route"
_ROUTE_HEADER = ROUTE_HEADER.encode()
_TIER_HEADER = TIER_HEADER.encode()


@dataclass(frozen=True)
class ProxiedRoute:
    """A generation route: its metric label, the upstream path it goes to and its wire format."""

    endpoint: str
    path: str
    dialect: Dialect = OPENAI


CHAT = ProxiedRoute("chat", "/v1/chat/completions")
COMPLETIONS = ProxiedRoute("completions", "/v1/completions")
RESPONSES_CREATE = ProxiedRoute("responses", "/v1/responses", RESPONSES)
GENERATE = ProxiedRoute("generate", "/generate", NATIVE)
OLLAMA_CHAT = ProxiedRoute("ollama_chat", "/api/chat", OLLAMA)
OLLAMA_GENERATE = ProxiedRoute("ollama_generate", "/api/generate", OLLAMA)


def runtime_of(request: Request) -> Runtime:
    """The gateway runtime serving this request."""
    return request.app.state.runtime  # type: ignore[no-any-return]


def new_request_id() -> str:
    """A new request id: 32 hex digits, uuid4().hex's shape."""
    return os.urandom(16).hex()


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of request header `name` (lower case), if the request has one."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def check_model(rt: Runtime, model: str) -> None:
    """Refuse a model id the gateway does not serve, as OpenAI does (404 `model_not_found`)."""
    known = rt.model_ids()
    if known and model not in known:
        raise OpenAIError(404, f"The model '{model}' does not exist; available: {', '.join(known)}", param="model", code="model_not_found")


def forced_route(rt: Runtime, scope: Scope) -> str | None:
    """The backend or mode the client's route header forces, when the gateway allows that header."""
    if not rt.settings.security.allow_route_header:
        return None
    forced = header(scope, _ROUTE_HEADER)
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


def take_tier(rt: Runtime, scope: Scope, body: dict[str, Any], field: object) -> Tier | None:
    """The tier a request asks for (its body's `field`, else the header; None: neither), adding
    SGLang's own `priority` to `body` when the operator enabled SGLang's priority scheduling."""
    tier = requested_tier(field, header(scope, _TIER_HEADER))
    if rt.settings.policy.tier_sglang_priority and "priority" not in body:
        body["priority"] = SGLANG_PRIORITY[served_tier(scope, tier)]
    return tier


def served_tier(scope: Scope, tier: Tier | None) -> Tier:
    """The tier a request asking for `tier` (None: none) is served as: at most its tenant's ceiling."""
    tenant = request_tenant(scope)
    return at_most(tier or DEFAULT, tenant.service_tier if tenant is not None else None)


def build_job(
    rt: Runtime,
    scope: Scope,
    route: ProxiedRoute,
    body: dict[str, Any],
    *,
    stream: bool,
    client_wants_usage: bool = True,
    weight: int = 1,
    tier: Tier | None = None,
    echo_tier: bool = False,
    pinned: str | None = None,
    prepare: Callable[[dict[str, Any], str], None] | None = None,
    on_accepted: Callable[[str], None] | None = None,
) -> ProxyJob:
    """The job for a validated request of `route` (see `ProxyJob` for the fields).

    The route header is checked here; `pinned` (the backend holding what the request continues)
    wins over it. `echo_tier`: the response names the tier that served it (so it does when the
    tenant's ceiling lowered the tier).
    """
    forced = forced_route(rt, scope)
    served = served_tier(scope, tier)
    return ProxyJob(
        endpoint=route.endpoint,
        path=route.path,
        body=body,
        stream=stream,
        client_wants_usage=client_wants_usage,
        forced=pinned if pinned is not None else forced,
        request_id=new_request_id(),
        arrived_at=scope.get("state", {}).get("arrived_at", time.monotonic()),
        dialect=route.dialect,
        weight=weight,
        prepare=prepare,
        on_accepted=on_accepted,
        tier=served,
        echo_tier=echo_tier or served != (tier or DEFAULT),
        tenant=request_tenant(scope),
        prefix=PromptKey.of(route.dialect.prompt_text(body)),
    )
