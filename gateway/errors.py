"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status.

Every error the gateway emits, from middleware, validation, routing or an upstream failure, goes
through `OpenAIError` so clients see one shape whatever went wrong.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

# OpenAI's `type` for each status; clients (and the openai SDK) key their exception class on status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


# Codes that must not depend on the Python version's HTTP phrase (413's changed in 3.13).
_HTTP_CODES = {413: "request_too_large"}


class OpenAIError(Exception):
    """An error to send to the client as OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON body, encoded."""
        return error_body(self.message, self.type, self.param, self.code)

    def to_response(self) -> Response:
        """A complete HTTP response carrying this error."""
        return Response(self.body(), status_code=self.status, headers=self.headers, media_type="application/json")

    def sse_event(self) -> bytes:
        """The error as one SSE event, for a stream whose headers are already sent."""
        return b"data: " + self.body() + b"\n\n"


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> bytes:
    """Encode OpenAI's error object."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def upstream_error(status: int, payload: bytes) -> OpenAIError:
    """Turn an upstream (SGLang) error body into an OpenAIError with the same status.

    SGLang answers with a flat `{"object": "error", "message", "type", "param", "code"}`; OpenAI-style
    servers nest it under "error". Either way the client gets the nested shape and the message.
    """
    message = f"upstream returned HTTP {status}"
    param = None
    try:
        parsed: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        if isinstance(inner, dict):
            message = str(inner.get("message") or message)
            param = inner.get("param") if isinstance(inner.get("param"), str) else None
        elif isinstance(inner, str):
            message = inner
    return OpenAIError(status, message, param=param, code="upstream_error")


def _validation_param(errors: list[dict[str, Any]]) -> str | None:
    if not errors:
        return None
    loc = [str(part) for part in errors[0].get("loc", ()) if part not in ("body", "query", "header", "path")]
    return ".".join(loc) or None


def _validation_message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Make FastAPI's own errors (validation, 404, 405, parse failures, unexpected 500s) OpenAI-shaped."""

    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        errors = list(exc.errors())
        return OpenAIError(
            400, _validation_message(errors), param=_validation_param(errors), code="invalid_request"
        ).to_response()

    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
        message = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else phrase
        code = _HTTP_CODES.get(status, phrase.lower().replace(" ", "_"))
        if status == 404:
            message = f"no route for {request.method} {request.url.path}"
        return OpenAIError(status, message, code=code, headers=exc.headers).to_response()

    async def on_openai(request: Request, exc: OpenAIError) -> Response:
        return exc.to_response()

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Starlette still re-raises it after this answer, so the traceback reaches the log.
        return OpenAIError(500, "internal error in the gateway", code="internal_error").to_response()

    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(OpenAIError, on_openai)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, on_unexpected)
