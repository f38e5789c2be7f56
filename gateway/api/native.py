"""SGLang's native surface: `/generate` (proxied like chat), tokenize/detokenize, `/abort_request`, `/flush_cache`.

`/generate` takes a slot of the request's weight (prompts x n) and goes through the same proxy as
the OpenAI routes. Tokenize and detokenize are answered by any ready backend without a slot (both
serve the same tokenizer); `/abort_request` goes to the backend running that rid when the gateway
knows it, else to every ready backend; `/flush_cache` to every ready backend.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.api.jobs import GENERATE, build_job, runtime_of
from gateway.api.openai import STREAM_DOC
from gateway.dialects.native import NativeInputError, parse_native
from gateway.errors import OpenAIError
from gateway.pool.backends import Backend
from gateway.proxy.exchange import ProxyResponse
from gateway.proxy.job import ProxyJob
from gateway.runtime import Runtime
from gateway.upstream.errors import UPSTREAM_ERRORS

router = APIRouter()


class _TrackedResponse(ProxyResponse):
    """A native request whose rids the gateway can find for `/abort_request` while it runs."""

    def __init__(self, runtime: Runtime, job: ProxyJob, rids: tuple[str, ...]) -> None:
        super().__init__(runtime, job)
        self._table = runtime.rids
        self._rids = rids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        def where() -> str | None:
            return self.routed_to

        self._table.add(self._rids, where)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._table.discard(self._rids, where)


async def _json_body(request: Request) -> Any:
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc


@router.api_route("/generate", methods=["POST", "PUT"], response_class=Response, responses=STREAM_DOC)
async def generate(request: Request) -> Response:
    """SGLang's native generation (text or input_ids, one prompt or a batch) on the backend the policy picks."""
    rt = runtime_of(request)
    body = await _json_body(request)
    try:
        native = parse_native(body)
    except NativeInputError as exc:
        raise OpenAIError(400, str(exc), code="invalid_request") from exc
    # Counts ride in every event's meta_info: nothing to ask for, nothing to strip.
    job = build_job(rt, request.scope, GENERATE, body, stream=native.stream, weight=native.weight)
    return _TrackedResponse(rt, job, native.upstream_rids(job.request_id))


def _ready(rt: Runtime) -> list[Backend]:
    backends = sorted((b for b in rt.pool if b.available), key=lambda b: b.inflight_total)
    if not backends:
        raise OpenAIError(503, "no backend is ready", code="no_backend_available", type="server_error")
    return backends


async def _post(rt: Runtime, backend: Backend, path: str, body: bytes) -> tuple[int, bytes, str]:
    """POST a small request upstream; (status, body, content type). Raises one of `UPSTREAM_ERRORS`."""
    resp = await rt.upstreams[backend.name].post(path, body)
    try:
        payload = await resp.read(rt.settings.timeouts.idle)
        return resp.status, payload, resp.headers.get("Content-Type", "application/json")
    finally:
        resp.close()


async def _first_answer(rt: Runtime, path: str, body: Any) -> Response:
    """Send to the least busy ready backend; another one if it cannot be reached."""
    for backend in _ready(rt):
        forwarded = dict(body)
        if backend.served_model_name and "model" in forwarded:
            forwarded["model"] = backend.served_model_name
        try:
            status, payload, content_type = await _post(rt, backend, path, orjson.dumps(forwarded))
        except UPSTREAM_ERRORS:
            rt.metrics.upstream_errors.labels(backend.name, "connect").inc()
            continue
        return Response(payload, status_code=status, media_type=content_type, headers={"x-specgate-backend": backend.name})
    raise OpenAIError(502, f"no backend answered {path}", code="upstream_unreachable", type="server_error")


async def _object_body(request: Request) -> dict[str, Any]:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object", code="invalid_request")
    return body


@router.post("/v1/tokenize")
@router.post("/tokenize", include_in_schema=False)
async def tokenize(request: Request) -> Response:
    """SGLang's tokenizer, from any ready backend (no in-flight slot)."""
    return await _first_answer(runtime_of(request), "/v1/tokenize", await _object_body(request))


@router.post("/v1/detokenize")
@router.post("/detokenize", include_in_schema=False)
async def detokenize(request: Request) -> Response:
    """SGLang's detokenizer, from any ready backend (no in-flight slot)."""
    return await _first_answer(runtime_of(request), "/v1/detokenize", await _object_body(request))


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    """Abort by `rid` on the backend running it (every ready backend when unknown), or all with `abort_all`."""
    rt = runtime_of(request)
    body = await _object_body(request)
    rid = body.get("rid", "")
    if not isinstance(rid, str) or not isinstance(body.get("abort_all", False), bool):
        raise OpenAIError(400, "rid must be a string and abort_all a boolean", code="invalid_request")
    known = None if body.get("abort_all") else rt.rids.backend_of(rid)
    targets = [rt.pool[known]] if known is not None else [b for b in rt.pool if b.available]
    return await _fan_out(rt, targets, "/abort_request", orjson.dumps(body))


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    """Flush every ready backend's prefix cache (SGLang's benchmark does between warm-up and the run)."""
    rt = runtime_of(request)
    timeout = request.query_params.get("timeout")
    path = "/flush_cache" if timeout is None else f"/flush_cache?{urlencode({'timeout': timeout})}"
    return await _fan_out(rt, [b for b in rt.pool if b.available], path, b"")


async def _fan_out(rt: Runtime, targets: list[Backend], path: str, payload: bytes) -> Response:
    """POST to every target at once; the first non-200 answer, else the first answer."""
    if not targets:
        raise OpenAIError(503, "no backend is ready", code="no_backend_available", type="server_error")
    answers = await asyncio.gather(*(_post(rt, b, path, payload) for b in targets), return_exceptions=True)
    for backend, answer in zip(targets, answers, strict=True):
        if isinstance(answer, BaseException):
            raise OpenAIError(
                502, f"backend {backend.name} did not answer {path}", code="upstream_unreachable", type="server_error"
            )
    replies = [a for a in answers if not isinstance(a, BaseException)]
    status, reply, content_type = next((r for r in replies if r[0] != 200), replies[0])
    return Response(reply, status_code=status, media_type=content_type or None)
