"""API-key authentication as pure ASGI middleware (no per-request allocation beyond a header scan).

Client keys gate every route but the probes (`/health`, `/ready`) and, unless configured otherwise,
`/metrics`, as SGLang does. Admin routes take the admin key when one is set, and so do SGLang's
own admin-optional routes the gateway relays (`/abort_request`, `/flush_cache`): a client key
must not abort or flush other clients' work. Keys are compared in
constant time and never logged or echoed; a client key's tenant (edge/tenants.py) goes on the
request's scope for the routes and the proxy.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config import SecurityConfig
from gateway.edge.tenants import KeyRing
from gateway.errors import OpenAIError

_PROBES = ("/health", "/ready")
SGLANG_ADMIN_PATHS = ("/abort_request", "/flush_cache")


class AuthMiddleware:
    """Rejects requests without a valid `Authorization: Bearer <key>` with a 401 OpenAI error."""

    def __init__(self, app: ASGIApp, security: SecurityConfig) -> None:
        self.app = app
        self._clients = KeyRing(security)
        self._closed = bool(self._clients)  # any client key configured (else the client routes are open)
        self._admin_key = security.admin_api_key.get_secret_value().encode() if security.admin_api_key else None
        self._open = _PROBES + (("/metrics",) if security.metrics_public else ())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        admin_key = self._admin_key if path.startswith("/admin") or path in SGLANG_ADMIN_PATHS else None
        if path in self._open or (admin_key is None and not self._closed):
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        tenant = None
        if admin_key is not None:
            matched = hmac.compare_digest(token, admin_key)
        else:
            matched, tenant = self._clients.match(token)
        if not matched:
            kind = "admin API key" if admin_key is not None else "API key"
            err = OpenAIError(
                401,
                f"missing or invalid {kind}; send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await err.to_response()(scope, receive, send)
            return
        if tenant is not None:
            scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""
