"""API-key authentication as pure ASGI middleware (no per-request allocation beyond a header scan).

Client keys gate every route but the probes (`/health`, `/ready`) and, unless configured otherwise,
`/metrics`, as SGLang does. Admin routes take the admin key when one is set, and so do SGLang's
own admin-optional routes the gateway relays (`/abort_request`, `/flush_cache`): a client key
must not abort or flush other clients' work. Keys are compared in
constant time and never logged or echoed.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config import SecurityConfig
from gateway.errors import OpenAIError

_PROBES = ("/health", "/ready")
SGLANG_ADMIN_PATHS = ("/abort_request", "/flush_cache")


class AuthMiddleware:
    """Rejects requests without a valid `Authorization: Bearer <key>` with a 401 OpenAI error."""

    def __init__(self, app: ASGIApp, security: SecurityConfig) -> None:
        self.app = app
        self._client_keys = [k.get_secret_value().encode() for k in security.api_keys]
        self._admin_key = security.admin_api_key.get_secret_value().encode() if security.admin_api_key else None
        self._open = _PROBES + (("/metrics",) if security.metrics_public else ())

    def _keys_for(self, path: str) -> list[bytes]:
        if (path.startswith("/admin") or path in SGLANG_ADMIN_PATHS) and self._admin_key is not None:
            return [self._admin_key]
        return self._client_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        keys = self._keys_for(path)
        if not keys or path in self._open:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        # Compare against every key so timing does not reveal which one (or how much) matched.
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(token, key)
        if not matched:
            kind = "admin API key" if keys is not self._client_keys else "API key"
            err = OpenAIError(
                401,
                f"missing or invalid {kind}; send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await err.to_response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""
