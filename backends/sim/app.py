"""The FastAPI app of one simulated server: SGLang's paths, status codes and JSON shapes."""

from __future__ import annotations

import os
import signal
from http import HTTPStatus

import orjson
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr, ValidationError
from starlette.background import BackgroundTask
from starlette.responses import Response

from backends.sim.endpoint import Endpoint
from backends.sim.faults import FAULT_ADAPTER, CrashFault, FaultSpec, describe_error
from backends.sim.middleware import ApiKeyMiddleware, HangMiddleware, HttpMetricsMiddleware
from backends.sim.native_routes import install_native_routes
from backends.sim.ollama import add_ollama_routes
from backends.sim.request import RequestError
from backends.sim.protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    error_response,
    json_response,
    model_not_found,
)
from backends.sim.responses_api import ResponseStore, add_responses_routes
from backends.sim.status import LOAD_SECTIONS, loads, loads_prometheus, model_card, model_info, model_list, server_info


async def _require_json(request: Request) -> None:
    """SGLang refuses OpenAI bodies that are not `application/json` with its validation error."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise RequestValidationError(
            [
                {
                    "loc": ["header", "content-type"],
                    "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                    "type": "value_error",
                }
            ]
        )


def _validation_message(exc: RequestValidationError) -> str:
    """One line per invalid field, e.g. `body.messages: Field required`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}" for err in exc.errors()
    )


def trace_headers(request: Request) -> dict[str, str]:
    """The W3C trace-context headers SGLang reads (`srt/observability/trace.py`, TRACE_HEADERS)."""
    return {name: request.headers[name] for name in ("traceparent", "tracestate") if name in request.headers}


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def create_app(ep: Endpoint) -> FastAPI:
    """The app serving `ep`."""
    app = FastAPI(title=f"specgate sim ({ep.role})", openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(_validation_message(exc), HTTPStatus.BAD_REQUEST, HTTPStatus.BAD_REQUEST.phrase)

    @app.exception_handler(HTTPException)
    async def _on_http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(str(exc.detail), exc.status_code, str(exc.status_code))

    def generate(body: ChatCompletionRequest | CompletionRequest, request: Request) -> Response:
        try:
            return ep.start_generation(body, trace_headers=trace_headers(request))
        except RequestError as exc:
            return error_response(str(exc))

    @app.post("/v1/chat/completions", dependencies=[Depends(_require_json)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return generate(body, request)

    @app.post("/v1/completions", dependencies=[Depends(_require_json)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return generate(body, request)

    add_responses_routes(app, ep, ResponseStore(ep.settings.enable_response_store))
    add_ollama_routes(app, ep)
    install_native_routes(app, ep)

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response(model_list(ep))

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Response:
        if model != ep.served_model_name:
            return model_not_found(model)
        return json_response(model_card(ep, model))

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        # SGLang's probe is a 1-token generation that rides along with the next batch.
        if not ep.ready:
            return Response(status_code=503)
        await ep.engine.next_step()
        return Response(status_code=200 if ep.ready else 503)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if ep.ready else 503)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        return json_response(model_info(ep))

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        return json_response(server_info(ep))

    @app.get("/v1/loads")
    async def get_loads(dp_rank: int | None = None, include: str | None = None, format: str | None = None) -> Response:
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= LOAD_SECTIONS:
            raise HTTPException(
                status_code=400,
                detail=f"Invalid include sections: {sections - LOAD_SECTIONS}. Valid options: {sorted(LOAD_SECTIONS)}",
            )
        if format == "prometheus":
            return Response(
                loads_prometheus(ep, sections, dp_rank), media_type="text/plain; version=0.0.4; charset=utf-8"
            )
        return json_response(loads(ep, sections, dp_rank))

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> Response:
        if body.abort_all:
            ep.engine.abort_all()
        elif (req := ep.engine.find(body.rid)) is not None:
            ep.engine.abort(req)
        return Response(status_code=200)

    if ep.metrics is not None:
        registry = ep.metrics.registry

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    if ep.settings.enable_test_endpoints:

        @app.get("/_test/requests")
        async def test_requests(rid: str | None = None) -> Response:
            records = [r.record() for r in ep.engine.recent_requests() if rid is None or r.rid == rid]
            return json_response(records)

        @app.get("/_test/fault")
        async def test_faults() -> Response:
            return json_response({"faults": ep.faults.listing()})

        @app.post("/_test/fault")
        async def set_fault(request: Request) -> Response:
            try:
                fault = FAULT_ADAPTER.validate_python(orjson.loads(await request.body()))
            except (ValidationError, orjson.JSONDecodeError) as exc:
                return error_response(f"invalid fault: {describe_error(exc)}")
            if isinstance(fault, CrashFault):
                return Response(
                    orjson.dumps({"faults": ["crash"]}),
                    media_type="application/json",
                    background=BackgroundTask(_kill_self),
                )
            apply_fault(ep, fault)
            return json_response({"faults": ep.faults.listing()})

    app.add_middleware(
        ApiKeyMiddleware, api_key=_secret(ep.settings.api_key), admin_api_key=_secret(ep.settings.admin_api_key)
    )
    app.add_middleware(HangMiddleware, faults=ep.faults)
    if ep.metrics is not None:
        app.add_middleware(HttpMetricsMiddleware, metrics=ep.metrics)
    return app


def apply_fault(ep: Endpoint, fault: FaultSpec) -> None:
    """Switch a (non-crash) fault on or off on `ep`, freezing or thawing its engine for `hang`."""
    ep.faults.apply(fault)
    hang = ep.faults.hang
    if hang is not None and hang.freeze_engine:
        ep.engine.freeze()
    elif ep.engine.frozen:
        ep.engine.thaw()


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()
