"""The gateway's ASGI application: FastAPI's app for every route, behind a front door with a short stack.

A request to a proxied route (`api/fast_path.py`) goes through the size limit, authentication and
the fast path only; what the fast path hands on, and every other route, goes to the whole FastAPI
app, which checks size and key again (same answer) and words every error. An exception escaping the
short stack still gets the OpenAI-shaped 500 the FastAPI app gives, then reaches uvicorn's log.
(Why a short stack: docs/benchmarks/gateway-overhead.md.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import __version__
from gateway.api.fast_path import PROXIED_ROUTES, FastProxyRoutes
from gateway.api.native import router as native_router
from gateway.api.ollama import router as ollama_router
from gateway.api.openai import router as openai_router
from gateway.api.ops import router as ops_router
from gateway.api.responses import router as responses_router
from gateway.edge.auth import AuthMiddleware
from gateway.edge.body_limit import BodyLimitMiddleware
from gateway.errors import OpenAIError, install_error_handlers
from gateway.runtime import Runtime


def create_app(runtime: Runtime) -> ASGIApp:
    """The ASGI app; its lifespan starts and stops the runtime (upstream pools, health checks).

    Proxied routes go through `FrontDoor`'s short stack first; the FastAPI app serves the rest.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    # FastAPI's native OpenTelemetry checks the global providers (and os.environ) on every request
    # (docs/benchmarks/gateway-overhead.md); specgate exports Prometheus metrics instead.
    app = FastAPI(
        title="specgate",
        version=__version__,
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.runtime = runtime
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(ollama_router)
    app.include_router(native_router)
    app.include_router(ops_router)
    # Added last = outermost: the size limit and arrival stamp run before authentication.
    app.add_middleware(AuthMiddleware, security=runtime.settings.security)
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.limits.max_body_bytes)
    return FrontDoor(app, runtime)


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
