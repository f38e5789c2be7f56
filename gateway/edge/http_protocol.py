"""uvicorn's httptools protocol with bounds on what a client may hold: head size, read time, connections.

httptools accepts request lines and headers of any size (a 10 MB header is buffered whole), and
uvicorn answers what it cannot parse with a plain-text 400, both before the ASGI app sees the
request; here a head larger than `max_head_bytes` gets a 431 and the connection is closed, and
every parse error gets OpenAI's error JSON. uvicorn waits forever for a head or a body that never
completes; here a connection's `ReadDeadline` (`read_deadline.py`, one timer per connection) ends
it: 408 where the client can be told, else a close. A connection over the per-client cap
(`client_cap.py`) is closed as it is accepted. It also offers each request a synchronous body
writer (`body_writer.py`) for the streaming relay, which also hears when the client leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.edge.body_writer import client_gone, offer
from gateway.edge.client_cap import ClientCap, Release
from gateway.edge.read_deadline import BODY, HEAD, IDLE, Phase, ReadDeadline
from gateway.errors import OpenAIError


def _ignore(phase: str) -> None:
    pass


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client connection may take of the server (`[limits]`), and where refusals are counted."""

    max_head_bytes: int
    header_timeout: float = 30.0  # for a complete request head, from its first byte
    body_timeout: float = 30.0  # between two reads of a request body
    cap: ClientCap | None = None  # connections per client address; None: no cap
    on_timeout: Callable[[str], None] = _ignore  # told "head" or "body" for each connection ended


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools turns it into a parse error."""


class GatewayHttpProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` that refuses oversized heads (431), slow clients (408) and clients over
    their connection cap, and shapes parse errors (400)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._max_head_bytes = limits.max_head_bytes
        self._reading_head = True  # no request started yet, or the last one's body is complete
        self._head_fed = 0  # bytes received while reading the current head (an upper bound on its size)
        self._head_parsed = 0  # exact bytes of request line and headers parsed so far
        self._head_over = False
        self._target_seen = False  # the current head's request target began: a 408 can be understood
        self._deadline: ReadDeadline | None = None  # None: refused at accept, unknown to uvicorn
        self._read_at = 0.0  # the loop's time of the read being parsed
        self._release_client: Release | None = None

    def connection_made(self, transport: Any) -> None:  # an asyncio.Transport
        cap = self._limits.cap
        if cap is not None:
            self._release_client = cap.admit(transport.get_extra_info("peername"))
            if self._release_client is None:
                self.transport = transport
                transport.close()
                return
        super().connection_made(transport)
        limits = self._limits
        self._deadline = ReadDeadline(self.loop, limits.header_timeout, limits.body_timeout, self._expired)

    def data_received(self, data: bytes) -> None:
        deadline = self._deadline
        assert deadline is not None, "a refused connection is closed before it reads"
        self._read_at = now = self.loop.time()
        phase = deadline.phase
        if phase is BODY:
            deadline.body(now)
        elif phase is not HEAD:  # the first byte of a head (even a stray line break)
            deadline.head(now)
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
        deadline = self._deadline
        if deadline is not None and deadline.phase is IDLE:  # a pipelined request after a complete one
            deadline.head(self._read_at)

    def on_url(self, url: bytes) -> None:
        self._target_seen = True
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        super().on_headers_complete()
        assert self._deadline is not None
        if self.cycle is not None and self.cycle.scope is self.scope:  # else: an upgrade, no HTTP cycle
            offer(self.scope, self.cycle)  # also when the request waits behind a pipelined one
            self._deadline.body(self._read_at)
        else:
            self._deadline.idle()

    def on_message_complete(self) -> None:
        self._reading_head = True
        self._head_fed = 0
        self._target_seen = False
        super().on_message_complete()
        assert self._deadline is not None
        self._deadline.idle()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and self.timeout_keep_alive_task is None and not self.pipeline:
            # Answered before its body was read (a 413, a 401): each read of the rest cancelled
            # uvicorn's keep-alive timer, which nothing would arm again.
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        deadline = self._deadline
        if deadline is not None and deadline.phase is HEAD:  # a head that waited behind this response
            deadline.head(self.loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is None:  # refused at accept: uvicorn never saw it
            return
        self._deadline.close()
        if self._release_client is not None:
            self._release_client()
            self._release_client = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the response had not completed
            client_gone(cycle.scope)

    def _expired(self, phase: Phase) -> bool:
        """The client did not send its head or body in time: 408 where that can be told, then close.

        False (keep waiting) when the wait is the server's: a head behind a response still running,
        a body the server stopped reading (its buffer is full, or the request waits behind another).
        """
        if self.transport.is_closing():  # closed already (a 431, a 400): connection_lost is on its way
            return True
        cycle = self.cycle
        if phase is BODY:
            if self.flow.read_paused:
                return False
            tell = cycle is not None and not cycle.response_started
            self._limits.on_timeout("body")
            wanted = f"the request body did not arrive within {self._limits.body_timeout:g} s"
        else:
            if cycle is not None and not cycle.response_complete:
                return False
            tell = self._target_seen
            self._limits.on_timeout("head")
            wanted = f"the request head did not arrive within {self._limits.header_timeout:g} s"
        if tell:
            self._answer(OpenAIError(408, wanted, code="request_timeout", type="invalid_request_error"))
        else:
            self.transport.close()
        return True

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
        self._answer(err)

    def _answer(self, err: OpenAIError) -> None:
        """Write `err` as the connection's last response and close it (at once if the client reads nothing)."""
        body = err.body()
        head = [f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}".encode()]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(), b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that does not read would keep the connection open
        else:
            self.transport.close()
