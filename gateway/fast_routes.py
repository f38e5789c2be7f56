"""The proxied routes' fast path: raw ASGI in front of FastAPI's router for well-formed requests.

FastAPI's route machinery (routing, dependency solving, the request object, the body model) cost
about 150 us of the gateway's CPU per proxied request: 510 us before this path, 353 us with it,
for non-streamed requests at concurrency 32 on loopback (docs/benchmarks/gateway-overhead.md).
It sits in the front door's short stack (gateway/front_door.py), behind the size limit and
authentication, and serves a POST to
a proxied route itself when the request is surely valid: JSON body, known model, valid route
header, and a body `gateway.schemas.surely_valid` accepts. Anything else, including every request
that will end in a 4xx, is handed on to the FastAPI route with its body replayed, so validation
errors keep their exact wording.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.policy import MODE_EAGLE, MODE_PLAIN
from gateway.proxy import CLIENT_GONE, UNROUTED, ProxyResponse
from gateway.proxy_job import ProxyJob, choices
from gateway.runtime import Runtime
from gateway.schemas import surely_valid, wants_usage
from gateway.tiers import DEFAULT, TIER_FIELD, TIER_HEADER

ROUTE_HEADER = b"x-specgate-route"
_TIER_HEADER = TIER_HEADER.encode()
# path -> (metric endpoint label, upstream path); routes added here must also exist as FastAPI routes.
PROXIED_ROUTES: dict[str, tuple[str, str]] = {
    "/v1/chat/completions": ("chat", "/v1/chat/completions"),
    "/v1/completions": ("completions", "/v1/completions"),
}


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

    def __init__(self, app: ASGIApp, runtime: Runtime, routes: dict[str, tuple[str, str]] | None = None) -> None:
        self.app = app
        self._rt = runtime
        self._routes = PROXIED_ROUTES if routes is None else routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        content_type = forced = None
        tiered = self._rt.settings.policy.tier_sglang_priority
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == ROUTE_HEADER:
                forced = value
            elif name == _TIER_HEADER:
                tiered = True
        # A service tier (or SGLang's priority to add) takes the full route, where gateway/tiers.py reads it.
        if tiered or not _is_json(content_type):
            await self.app(scope, receive, send)
            return
        body, stopped = await _read_body(receive)
        if isinstance(stopped, dict) and stopped["type"] == "http.disconnect":
            self._count_gone(route[0])  # nobody is left to answer, on any route
            return
        job = self._job(scope, route, body, forced) if body is not None else None
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

    def _job(self, scope: Scope, route: tuple[str, str], raw: bytes, forced_raw: bytes | None) -> ProxyJob | None:
        """The job for a surely valid request; None sends it down the full route."""
        rt = self._rt
        endpoint, path = route
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not surely_valid(endpoint, body) or TIER_FIELD in body:
            return None
        known = rt.model_ids()
        if known and body["model"] not in known:
            return None
        forced: str | None = None
        if forced_raw is not None and rt.settings.security.allow_route_header:
            forced = forced_raw.decode("latin-1")
            if forced not in rt.pool and forced not in (MODE_EAGLE, MODE_PLAIN):
                return None
        return ProxyJob(
            endpoint=endpoint,
            path=path,
            body=body,
            stream=body.get("stream", False),
            client_wants_usage=wants_usage(body),
            forced=forced,
            request_id=os.urandom(16).hex(),  # uuid4().hex's shape at a third of its cost
            arrived_at=scope.get("state", {}).get("arrived_at", time.monotonic()),
            weight=choices(body),
        )
