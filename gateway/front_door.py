"""The gateway's outermost ASGI app: proxied POSTs take a short stack, everything else FastAPI's.

Starlette's and FastAPI's generic middleware stack (the server-error catcher, FastAPI's telemetry
and body-limit hooks, the exception middleware) wrapped every proxied request and every message it
sent, for nothing a proxied request needs: about 6% of the gateway's CPU at C=64 (py-spy). A
request to a proxied route (`gateway/fast_routes.py`) goes through the size limit, authentication
and the fast path only; what the fast path hands on (anything not surely valid) goes to the whole
FastAPI app, which checks size and key again (same answer) and words every error as before. An
exception escaping the short stack still gets the OpenAI-shaped 500 the FastAPI app gives, then
reaches uvicorn's log.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from gateway.auth import AuthMiddleware
from gateway.errors import OpenAIError
from gateway.fast_routes import PROXIED_ROUTES, FastProxyRoutes
from gateway.limits import BodyLimitMiddleware
from gateway.runtime import Runtime


class FrontDoor:
    """Dispatches proxied routes to the short stack and the rest to `app`."""

    def __init__(self, app: FastAPI, runtime: Runtime) -> None:
        self.app = app
        settings = runtime.settings
        self._short = BodyLimitMiddleware(
            AuthMiddleware(FastProxyRoutes(app, runtime), security=settings.security), max_bytes=settings.limits.max_body_bytes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PROXIED_ROUTES:
            await self.app(scope, receive, send)
            return
        try:
            await self._short(scope, receive, send)
        except Exception:
            await _internal_error(scope, receive, send)
            raise


async def _internal_error(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer 500 when nothing was sent yet (the server refuses a second response start otherwise)."""
    err = OpenAIError(500, "internal error in the gateway", code="internal_error")
    try:
        await err.to_response()(scope, receive, send)
    except Exception:  # noqa: BLE001 - the response had started: uvicorn ends the connection
        pass
