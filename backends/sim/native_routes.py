"""The simulator's native SGLang routes: `/generate`, tokenize/detokenize (and their aliases), `/flush_cache`."""

from __future__ import annotations

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from backends.sim.endpoint import Endpoint
from backends.sim.native import NativeCall, detokenize, native_error, tokenize
from backends.sim.protocol import error_response, json_response
from backends.sim.request import RequestError


_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
_NOT_FLUSHED = "Flush cache failed.\n"


async def _body(request: Request) -> object:
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"invalid JSON body: {exc}") from exc


def install_native_routes(app: FastAPI, ep: Endpoint) -> None:
    """Add SGLang's native routes for `ep` to `app`."""
    call = NativeCall(ep)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            return call.start(await _body(request))
        except RequestError as exc:
            return native_error(str(exc))

    async def _object(request: Request) -> dict[str, object]:
        body = await _body(request)
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    @app.post("/v1/tokenize")
    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        try:
            return json_response(tokenize(ep, await _object(request)))
        except RequestError as exc:
            return error_response(str(exc))

    @app.post("/v1/detokenize")
    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> Response:
        try:
            return json_response(detokenize(await _object(request)))
        except RequestError as exc:
            return error_response(str(exc))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(timeout: float = 0.0) -> Response:
        # SGLang waits up to `timeout` seconds for its queues to drain, and refuses while requests remain.
        if not await ep.engine.flush_cache(timeout):
            return Response(_NOT_FLUSHED, status_code=400)
        return Response(_FLUSHED, status_code=200)
