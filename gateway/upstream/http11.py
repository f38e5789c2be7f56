"""A lean HTTP/1.1 exchange on one keep-alive connection: an `asyncio.Protocol` fed to httptools' parser.

A request is one prebuilt head plus the body written at once; the response's bytes go from
`data_received` through httptools (C) straight into one buffer, and nothing is allocated per read
but the bytes handed out (why not aiohttp's client: docs/benchmarks/upstream-clients.md).

A connection goes back to its pool (`connection_pool.py`) only after a complete response the
backend did not ask to close; anything odd (bytes while idle, a parse error, a caller leaving
mid-response) closes it. Closing mid-response is what makes SGLang abort the request. Failures are
`errors.py`'s kinds; a body that ends cleanly but early is no error here: `readuntil` hands back
the incomplete rest, and the relay calls that a truncated stream.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Protocol

import httptools

from gateway.upstream.errors import BadResponse, BodyDropped, ConnectFailed, WireError

_HIGH_WATER = 1 << 18  # buffered body bytes at which the socket stops being read (a slow reader)
MAX_FRAME = 1 << 17  # the longest frame `readuntil` returns, as aiohttp's reader allowed (2 x 64 KiB)


class Headers:
    """A response's headers as received; `get` matches names case-insensitively."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of header `name`, else `default`."""
        key = name.lower().encode("latin-1")
        for k, v in self.raw:
            if k.lower() == key:
                return v.decode("latin-1")
        return default

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None


class State(enum.Enum):
    """Where a connection is in its pool's hands."""

    BUSY = "busy"  # connecting, or carrying one exchange
    IDLE = "idle"  # in the pool, ready for the next request
    CLOSED = "closed"


class BodySink(Protocol):
    """Takes a response's body as it arrives, in the connection's read callback (`WireResponse.divert`)."""

    def data(self, data: bytes) -> None:
        """The next bytes of the body (a piece of a chunk, or several)."""

    def end(self, exc: BaseException | None) -> None:
        """The body ended: cleanly (None) or not (a `WireError`). Nothing follows."""


class WireResponse:
    """One response: its status and headers once they arrived, then its body as the bytes come."""

    __slots__ = ("status", "headers", "_conn", "_loop", "_buf", "_scan", "_done", "_exc", "_waiter", "_draining", "_sink")

    def __init__(self, conn: Connection) -> None:
        self.status = 0  # 0 until the head arrived
        self.headers = Headers([])
        self._conn: Connection | None = conn  # None once the exchange ended (the connection is pooled or closed)
        self._loop = conn.loop  # asyncio.get_running_loop() costs a getpid() system call on Python 3.11
        self._buf = bytearray()
        self._scan = 0  # where the next separator search starts
        self._done = False  # the body ended cleanly
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._draining = False  # read(): take everything, never pause the socket
        self._sink: BodySink | None = None

    async def read(self, timeout: float | None = None) -> bytes:
        """The whole (rest of the) body; raises `BodyDropped`, or TimeoutError after `timeout` seconds."""
        self._draining = True
        if self._conn is not None:
            self._conn.resume()
        timer = None
        if timeout is not None and not self._done and self._exc is None:
            timer = self._loop.call_at(self._loop.time() + timeout, self._expire)
        try:
            while not self._done:
                if self._exc is not None:
                    raise self._exc
                await self._wait()
        finally:
            if timer is not None:
                timer.cancel()
        data = bytes(self._buf)
        self._buf.clear()
        return data

    async def readuntil(self, separator: bytes) -> bytes:
        """The next frame ending in `separator`; at the body's end, whatever is left (possibly b"").

        Raises `BodyDropped` once the frames that arrived before a broken connection are handed out,
        and ValueError for a frame longer than `MAX_FRAME`.
        """
        buf = self._buf
        while True:
            at = buf.find(separator, self._scan)
            if at >= 0:
                end = at + len(separator)
                frame = bytes(buf[:end])
                del buf[:end]
                self._scan = 0
                conn = self._conn
                if conn is not None and conn.paused and len(buf) < _HIGH_WATER // 2:
                    conn.resume()
                return frame
            if len(buf) > MAX_FRAME:
                raise ValueError(f"a frame longer than {MAX_FRAME} bytes")
            self._scan = max(0, len(buf) - len(separator) + 1)
            if self._exc is not None:
                raise self._exc
            if self._done:
                rest = bytes(buf)
                buf.clear()
                return rest
            await self._wait()

    async def wait_head(self, deadline: float) -> None:
        """Wait for the status line and headers until loop time `deadline` (then TimeoutError).

        Any failure closes the connection: the request may be running upstream.
        """
        timer = self._loop.call_at(deadline, self._expire)
        try:
            while self.status == 0:
                if self._exc is not None:
                    raise self._exc
                await self._wait()
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()

    def divert(self, sink: BodySink) -> None:
        """From now on hand the body to `sink` as it arrives, starting with what is already here.

        Instead of `readuntil` or `read`: no task waits, `sink` is called from the read callback.
        """
        self._sink = sink
        if self._conn is not None:
            self._conn.body_to(sink.data)
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            self.resume()
            sink.data(data)
        if self._exc is not None:
            sink.end(self._exc)
        elif self._done:
            sink.end(None)

    def pause(self) -> None:
        """Stop reading the socket (a diverted body's reader cannot keep up)."""
        if self._conn is not None:
            self._conn.pause()

    def resume(self) -> None:
        """Read the socket again."""
        if self._conn is not None:
            self._conn.resume()

    def release(self) -> None:
        """Done with the response: a finished exchange's connection is already pooled; else it is closed."""
        self.close()

    def close(self) -> None:
        """End the exchange; closes the connection unless the response had fully arrived."""
        conn, self._conn = self._conn, None
        self._sink = None  # it refers back to this response: no cycle left for the collector
        if conn is not None:
            conn.close()

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _expire(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError("the response stopped coming"))

    # What the connection reports.

    def _started(self, status: int, raw: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = Headers(raw)
        self._wake()

    def _feed(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink.data(data)
            return
        self._buf += data
        if len(self._buf) > _HIGH_WATER and not self._draining and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _finished(self) -> None:
        self._done = True
        self._conn = None
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.end(None)
        self._wake()

    def _abort(self, exc: BaseException) -> None:
        self._exc = exc
        self._conn = None
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.end(exc)
        self._wake()


class Connection(asyncio.Protocol):
    """One keep-alive connection to a backend; carries one exchange at a time."""

    def __init__(self, on_idle: Callable[[Connection], None], on_closed: Callable[[Connection, State], None]) -> None:
        self._on_idle = on_idle
        self._on_closed = on_closed
        self.loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._resp: WireResponse | None = None
        self._body: Callable[[bytes], None] = _drop  # where the current response's body bytes go
        self._head: list[tuple[bytes, bytes]] = []
        self._answered = False  # a byte of the current response arrived
        self.state = State.BUSY
        self.paused = False
        self.reused = False  # has carried an exchange before

    def send(self, data: bytes, resp: WireResponse) -> None:
        """Write one whole request; its response goes to `resp`."""
        assert self._transport is not None and self._resp is None
        self._resp = resp
        self._body = resp._feed
        self._head = []
        self._answered = False
        self._transport.write(data)

    def body_to(self, take: Callable[[bytes], None]) -> None:
        """Hand the current response's body bytes to `take` (a diverted body's sink) rather than to
        the response: the sink is then called from httptools' callback directly, a call less per chunk."""
        self._body = take

    def pause(self) -> None:
        if not self.paused and self._transport is not None:
            self.paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self._transport is not None:
            self.paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        """Close the socket (idempotent); the pool forgets the connection at once."""
        if self.state is State.CLOSED:
            return
        was, self.state = self.state, State.CLOSED
        if self._transport is not None:
            self._transport.close()
        self._on_closed(self, was)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self._resp
        if resp is None:  # bytes nobody asked for: nothing on this connection can be trusted
            self.close()
            return
        self._answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._resp = None
            if not resp._done:  # else: junk after a complete response, which is the backend's to keep
                error = BadResponse if resp.status == 0 else BodyDropped
                resp._abort(_caused(error(f"the backend's response could not be parsed: {exc}"), exc))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        resp, self._resp = self._resp, None
        self.close()
        if resp is None:
            return
        if resp.status == 0:
            error: WireError = BadResponse("the connection closed inside the response head") if self._answered else ConnectFailed("the connection closed before any response byte")
        elif _ends_at_eof(resp):
            resp._finished()
            return
        else:
            error = BodyDropped("the connection closed before the response body ended")
        resp._abort(_caused(error, exc))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head.append((name, value))

    def on_headers_complete(self) -> None:
        if self._resp is None:
            raise BadResponse("a response nobody asked for")
        self._resp._started(self._parser.get_status_code(), self._head)

    def on_body(self, body: bytes) -> None:
        if self._resp is not None:
            self._body(body)

    def on_message_complete(self) -> None:
        resp, self._resp = self._resp, None
        if resp is None:
            raise BadResponse("a response nobody asked for")
        keep = self._parser.should_keep_alive()
        resp._finished()
        if keep and self.state is State.BUSY:
            self.resume()
            self.reused = True
            self.state = State.IDLE
            self._on_idle(self)
        else:
            self.close()


def _drop(body: bytes) -> None:
    """No response is being received (`Connection.on_body` never calls it then)."""


def _ends_at_eof(resp: WireResponse) -> bool:
    """A response framed by the connection's close: no Content-Length and not chunked."""
    return "content-length" not in resp.headers and "transfer-encoding" not in resp.headers


def _caused(error: WireError, cause: BaseException | None) -> WireError:
    error.__cause__ = cause
    return error


def head_prefix(method: str, target: str, host: str, headers: dict[str, str]) -> bytes:
    """A request's head up to the Content-Length value, built once per backend and path."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items()), "Content-Length: "]
    return "\r\n".join(lines).encode("latin-1")

