"""Pure ASGI middlewares (no BaseHTTPMiddleware, so client disconnects still reach the responses).

- `HttpMetricsMiddleware`: SGLang's `sglang:http_*` metrics; the active gauge spans whole streams.
- `HangMiddleware`: the `hang` fault, answering nothing but `/_test/*` until the client gives up.
- `ApiKeyMiddleware`: SGLang's API-key rules (`srt/utils/auth.py`).
"""

from __future__ import annotations

import secrets
from enum import Enum

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.sim.faults import FaultState
from backends.sim.metrics import SimMetrics

TEST_PREFIX = "/_test/"

# Endpoint label values: the routes, with the ids of /v1/models/{model} and /v1/responses/{id} folded into one.
_KNOWN_ENDPOINTS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
        "/api/tags",
        "/api/show",
        "/v1/models",
        "/v1/loads",
        "/health",
        "/health_generate",
        "/ready",
        "/model_info",
        "/get_model_info",
        "/server_info",
        "/get_server_info",
        "/abort_request",
        "/metrics",
        "/_test/requests",
        "/_test/fault",
    }
)


def endpoint_label(path: str) -> str:
    """The `endpoint` label of a request path (unknown paths share one value)."""
    if path in _KNOWN_ENDPOINTS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{response_id}/cancel" if path.endswith("/cancel") else "/v1/responses/{response_id}"
    return "other"


class HttpMetricsMiddleware:
    """Counts requests and responses and tracks requests in progress, by endpoint and method."""

    def __init__(self, app: ASGIApp, metrics: SimMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        labels = self.metrics.http_labels(endpoint_label(scope["path"]), scope["method"])
        self.metrics.http_requests.labels(*labels).inc()
        active = self.metrics.http_active.labels(*labels)
        active.inc()
        status: int | None = None  # stays None when the client left before any response

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            active.dec()
            if status is not None:
                self.metrics.http_responses.labels(*labels, str(status)).inc()


class HangMiddleware:
    """While a `hang` fault is on, takes every request but `/_test/*` and never answers it."""

    def __init__(self, app: ASGIApp, faults: FaultState) -> None:
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.faults.hang is not None and not scope["path"].startswith(TEST_PREFIX):
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await self.app(scope, receive, send)


class AuthLevel(Enum):
    """How a route is protected (SGLang's `AuthLevel`)."""

    NORMAL = "normal"
    ADMIN_OPTIONAL = "admin_optional"


def auth_level(path: str) -> AuthLevel:
    """Admin routes (abort, cache flush and the test-only routes) take the admin key when one is configured."""
    if path in ("/abort_request", "/flush_cache") or path.startswith(TEST_PREFIX):
        return AuthLevel.ADMIN_OPTIONAL
    return AuthLevel.NORMAL


def _bearer_matches(headers: list[tuple[bytes, bytes]], expected: str) -> bool:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and secrets.compare_digest(token, expected):
                return True
        elif name == b"x-api-key" and secrets.compare_digest(value.decode("latin-1"), expected):
            return True
    return False


def allowed(
    path: str, method: str, headers: list[tuple[bytes, bytes]], api_key: str | None, admin_api_key: str | None
) -> bool:
    """SGLang's decision: health, readiness and metrics are always open; see `auth_level` for the rest."""
    if method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
        return True
    if auth_level(path) is AuthLevel.ADMIN_OPTIONAL:
        key = admin_api_key or api_key
        return key is None or _bearer_matches(headers, key)
    return api_key is None or _bearer_matches(headers, api_key)


class ApiKeyMiddleware:
    """Answers 401 `{"error": "Unauthorized"}` to requests without a valid key, as SGLang does."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_api_key = admin_api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not allowed(
            scope["path"], scope["method"], scope["headers"], self.api_key, self.admin_api_key
        ):
            body = orjson.dumps({"error": "Unauthorized"})
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
