"""Request-size limit and arrival timestamp, as the outermost pure ASGI middleware.

A body over the limit is refused with 413 before it is buffered: at once when Content-Length says
so, otherwise as soon as the streamed body crosses the limit.
"""

from __future__ import annotations

import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import OpenAIError


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`; stamps `scope["state"]["arrived_at"]` for overhead metrics."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if "arrived_at" not in state:  # a request the front door's short stack handed on keeps its stamp
            state["arrived_at"] = time.monotonic()
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(scope, receive, send, 400, "invalid Content-Length header")
                    return
                if declared > self.max_bytes:
                    await self._reject(scope, receive, send, 413, self._message())
                    return
        received = 0

        async def limited_receive() -> Message:
            # Raised inside the app's body read, where its exception handlers make it a 413 error.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"

    @staticmethod
    async def _reject(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        code = "request_too_large" if status == 413 else "invalid_request"
        await OpenAIError(status, message, code=code).to_response()(scope, receive, send)
