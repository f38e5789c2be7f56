"""The proxied routes' fast path: raw ASGI in front of FastAPI's router for well-formed requests.

It sits in the front door's short stack (gateway/app.py), behind the size limit and authentication,
and serves a POST to a proxied route itself when the request is surely valid: JSON body, known
model, valid route header, no service tier, and a body `schemas.surely_valid` accepts. Anything
else, including every request that will end in a 4xx, is handed on to the FastAPI route with its
body replayed, so errors keep their exact wording. (What FastAPI's route machinery costs per
request: docs/benchmarks/gateway-overhead.md.)
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.jobs import CHAT, COMPLETIONS, ProxiedRoute, build_job, check_model
from gateway.api.schemas import surely_valid, wants_usage
from gateway.errors import OpenAIError
from gateway.proxy.exchange import CLIENT_GONE, UNROUTED, ProxyResponse
from gateway.proxy.job import ProxyJob, choices
from gateway.runtime import Runtime
from gateway.tiers import DEFAULT, TIER_FIELD, TIER_HEADER

_TIER_HEADER = TIER_HEADER.encode()
# Routes added here must also exist as FastAPI routes (gateway/api/openai.py).
PROXIED_ROUTES: dict[str, ProxiedRoute] = {route.path: route for route in (CHAT, COMPLETIONS)}


def _is_json(content_type: bytes | None) -> bool:
    """What FastAPI parses as JSON: no content type, or application/json (parameters allowed)."""
    if content_type is None:
        return True
    kind = content_type.split(b";", 1)[0].strip().lower()
    return kind == b"application/json"


async def _read_body(receive: Receive) -> tuple[bytes | None, Message | HTTPException | None]:
    """The whole body, or (None, what stopped the read: a disconnect or the size limit's 413)."""
    parts: list[bytes] = []
    while True:
        try:
            message = await receive()
        except HTTPException as exc:
            return None, exc
        if message["type"] != "http.request":
            return None, message
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts) if len(parts) != 1 else parts[0], None


def _replaying(first: Message | HTTPException, receive: Receive) -> Receive:
    """A receive that yields (or raises) `first`, then the connection's own messages."""
    pending = [first]

    async def replayed() -> Message:
        if pending:
            item = pending.pop()
            if isinstance(item, HTTPException):
                raise item
            return item
        return await receive()

    return replayed


class FastProxyRoutes:
    """Serves well-formed proxied requests directly; hands the rest to the FastAPI app."""

    def __init__(self, app: ASGIApp, runtime: Runtime, routes: dict[str, ProxiedRoute] | None = None) -> None:
        self.app = app
        self._rt = runtime
        self._routes = PROXIED_ROUTES if routes is None else routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        content_type = None
        tiered = self._rt.settings.policy.tier_sglang_priority
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == _TIER_HEADER:
                tiered = True
        # A service tier (or SGLang's priority to add) takes the full route, which reads it.
        if tiered or not _is_json(content_type):
            await self.app(scope, receive, send)
            return
        body, stopped = await _read_body(receive)
        if isinstance(stopped, dict) and stopped["type"] == "http.disconnect":
            self._count_gone(route.endpoint)  # nobody is left to answer, on any route
            return
        job = self._job(scope, route, body) if body is not None else None
        if job is None:
            replay: Message | HTTPException = stopped if stopped is not None else {"type": "http.request", "body": body, "more_body": False}
            await self.app(scope, _replaying(replay, receive), send)
            return
        await ProxyResponse(self._rt, job)(scope, receive, send)

    def _count_gone(self, endpoint: str) -> None:
        """Count a request whose client left before its body was read as every client that left (499).

        uvicorn answers the first `receive()` with the disconnect once the connection is gone, body or not.
        """
        self._rt.metrics.requests.labels(UNROUTED, endpoint, CLIENT_GONE).inc()
        self._rt.metrics.tier_requests.labels(DEFAULT, CLIENT_GONE).inc()

    def _job(self, scope: Scope, route: ProxiedRoute, raw: bytes) -> ProxyJob | None:
        """The job for a surely valid request; None sends it down the full route (which words any error)."""
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not surely_valid(route.endpoint, body) or TIER_FIELD in body:
            return None
        try:
            check_model(self._rt, body["model"])
            return build_job(
                self._rt, scope, route, body,
                stream=body.get("stream", False), client_wants_usage=wants_usage(body), weight=choices(body),
            )
        except OpenAIError:
            return None
