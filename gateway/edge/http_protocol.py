"""uvicorn's httptools protocol with a bound on the request head and OpenAI-shaped parse errors.

httptools accepts request lines and headers of any size (a 10 MB header is buffered whole), and
uvicorn answers what it cannot parse with a plain-text 400, both before the ASGI app sees the
request; here a head larger than `max_head_bytes` gets a 431 and the connection is closed, and
every parse error gets OpenAI's error JSON. It also offers each request a synchronous body writer
(`body_writer.py`) for the streaming relay, which also hears when the client leaves.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.edge.body_writer import client_gone, offer
from gateway.errors import OpenAIError


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools turns it into a parse error."""


class GatewayHttpProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` that refuses oversized heads (431) and shapes parse errors (400)."""

    def __init__(self, *args: Any, max_head_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_head_bytes = max_head_bytes
        self._reading_head = True  # no request started yet, or the last one's body is complete
        self._head_fed = 0  # bytes received while reading the current head (an upper bound on its size)
        self._head_parsed = 0  # exact bytes of request line and headers parsed so far
        self._head_over = False

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_fed += len(data)
        super().data_received(data)
        # httptools buffers a header until it is complete, so an endless one never reaches on_header.
        if self._reading_head and self._head_fed > self._max_head_bytes and not self._head_over:
            self._head_over = True
            self.send_400_response("")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_parsed = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:  # else: an upgrade, no HTTP cycle
            offer(self.scope, self.cycle)  # also when the request waits behind a pipelined one

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the response had not completed
            client_gone(cycle.scope)

    def on_message_complete(self) -> None:
        self._reading_head = True
        self._head_fed = 0
        super().on_message_complete()

    def _count(self, size: int) -> None:
        self._head_parsed += size
        if self._head_parsed > self._max_head_bytes:
            self._head_over = True
            raise _HeadTooLarge

    def send_400_response(self, msg: str) -> None:
        """Answer a request that cannot be served at all, then close the connection."""
        if self._head_over:
            err = OpenAIError(
                431,
                f"request line and headers larger than {self._max_head_bytes} bytes",
                code="request_header_fields_too_large",
                type="invalid_request_error",
            )
        else:
            err = OpenAIError(400, "malformed HTTP request", code="invalid_http_request")
        body = err.body()
        head = [f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}".encode()]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(), b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()
