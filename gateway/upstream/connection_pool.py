"""A bounded pool of keep-alive connections to one backend, and the generation POST over it.

Like aiohttp's connector it was built to replace: at most `max_connections` sockets, the idle ones
reused last-in first-out; a request beyond the limit queues for the next one to come free, bounded
by the connect timeout, after which the gateway itself is out of resources (`LocalResourceError`,
"pool_full"), not the backend. The whole exchange up to the response's headers is bounded by the
first-byte timeout, with one timer handle per request, not a timeout context per step.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

from gateway.upstream.errors import ConnectFailed, LocalResourceError
from gateway.upstream.http11 import Connection, State, WireResponse, head_prefix

_CACHED_HEADS = 64  # request heads kept per backend: its routes, not every query string a client sends
_EXPIRED = object()  # what a queued request's future holds when its wait ran out


class WirePool:
    """Keep-alive connections to one backend (`base_url`), shared by its generation requests."""

    def __init__(
        self, base_url: str, *, headers: dict[str, str], connect_timeout: float, first_byte_timeout: float, max_connections: int
    ) -> None:
        url = urlsplit(base_url)
        https = url.scheme == "https"
        self.base_url = base_url
        self._addr = (url.hostname or "localhost", url.port or (443 if https else 80))
        self._ssl = ssl.create_default_context() if https else None
        self._host = url.netloc.rpartition("@")[2]
        self._prefix = url.path.rstrip("/")
        self._headers = headers
        self._heads: dict[str, bytes] = {}
        self._connect = connect_timeout
        self._first_byte = first_byte_timeout
        self._max = max_connections
        self._loop = asyncio.get_running_loop()
        self._idle: list[Connection] = []
        self._busy = 0  # connections connecting or carrying an exchange, and turns handed to queued requests
        self._waiters: deque[asyncio.Future[object]] = deque()
        self._open: set[Connection] = set()

    @property
    def open_connections(self) -> int:
        """Sockets the pool holds or is about to: in use, being dialled, idle (the descriptor budget counts them)."""
        return self._busy + len(self._idle)

    @property
    def full(self) -> bool:
        """True while every connection the pool may hold is in use."""
        return self._busy >= self._max

    async def post(self, path: str, body: bytes, headers: bytes = b"") -> WireResponse:
        """POST `body` (JSON) to `path`, with this request's own `headers` (whole head lines, each ending
        in CRLF) after the backend's; returns once the response's headers arrived.

        Raises `ConnectFailed` when no response byte came, `BadResponse` for an answer that is not
        HTTP, TimeoutError past the first-byte timeout, `LocalResourceError` when the pool stayed
        full for the connect timeout. The caller owns the response and must close or release it.
        """
        loop = self._loop
        start = loop.time()
        head = self._heads.get(path)
        if head is None:
            head = head_prefix("POST", self._prefix + path, self._host, self._headers)
            if len(self._heads) < _CACHED_HEADS:
                self._heads[path] = head
        data = b"".join((head, str(len(body)).encode(), b"\r\n", headers, b"\r\n", body))
        retried = False
        while True:
            conn = await self._acquire(start)
            resp = WireResponse(conn)
            conn.send(data, resp)
            try:
                await resp.wait_head(start + self._first_byte)
                return resp
            except ConnectFailed:
                # A kept-alive connection the backend closed just as the request went out: it was
                # never read, so it is sent once more rather than failed over.
                if not conn.reused or retried:
                    raise
                retried = True

    async def close(self) -> None:
        """Close every connection; requests still queued for one are told the pool is gone."""
        for conn in list(self._open):
            conn.close()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectFailed("the connection pool closed"))

    async def _acquire(self, start: float) -> Connection:
        if self._idle:
            conn = self._idle.pop()  # closed ones left the list as they closed
            conn.state = State.BUSY
            self._busy += 1
            return conn
        if self._busy >= self._max:
            handed = await self._queue(start)
            if isinstance(handed, Connection):
                return handed
        else:
            self._busy += 1
        try:
            return await self._dial(start)
        except BaseException:
            self._busy -= 1
            self._hand_on()
            raise

    async def _queue(self, start: float) -> object:
        """Wait for a turn: a connection some exchange left (returned), or None: room to dial one."""
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        connect_by, first_byte_by = start + self._connect, start + self._first_byte
        timer = self._loop.call_at(min(connect_by, first_byte_by), _expire, waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())
            else:
                self._forget(waiter)
            raise
        finally:
            timer.cancel()
        if handed is not _EXPIRED:
            return handed
        self._forget(waiter)
        if first_byte_by < connect_by:
            raise TimeoutError("no connection came free within the first-byte timeout")
        raise LocalResourceError("pool_full", f"no connection to {self.base_url} came free within {self._connect:g} s")

    async def _dial(self, start: float) -> Connection:
        loop = self._loop
        connect_by, first_byte_by = start + self._connect, start + self._first_byte
        try:
            async with asyncio.timeout_at(min(connect_by, first_byte_by)):
                _, conn = await loop.create_connection(self._new_connection, *self._addr, ssl=self._ssl)
        except TimeoutError as exc:
            if first_byte_by < connect_by:
                raise
            raise ConnectFailed(f"connecting to {self.base_url} took over {self._connect:g} s") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.base_url}: {exc}") from exc
        if conn.state is State.CLOSED:
            raise ConnectFailed(f"{self.base_url} closed the connection at once")
        self._open.add(conn)
        return conn

    def _new_connection(self) -> Connection:
        return Connection(self._on_idle, self._on_closed)

    def _on_idle(self, conn: Connection) -> None:
        """`conn` finished an exchange and may carry another: to the first queued request, else idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                conn.state = State.BUSY
                waiter.set_result(conn)
                return
        self._busy -= 1
        self._idle.append(conn)

    def _on_closed(self, conn: Connection, was: State) -> None:
        if conn not in self._open:  # closed while it was being dialled: `_acquire` counts that
            return
        self._open.discard(conn)
        if was is State.IDLE:
            self._idle.remove(conn)
        else:
            self._busy -= 1
            self._hand_on()

    def _hand_on(self) -> None:
        """A connection's room came free: the first queued request may dial one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._busy += 1
                waiter.set_result(None)
                return

    def _give_back(self, handed: object) -> None:
        """A queued request got its turn but was cancelled before it could use it."""
        if isinstance(handed, Connection):
            if handed.state is State.CLOSED:  # the pool already counted it gone
                return
            handed.state = State.IDLE
            self._on_idle(handed)
        elif handed is None:
            self._busy -= 1
            self._hand_on()

    def _forget(self, waiter: asyncio.Future[object]) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass


def _expire(waiter: asyncio.Future[object]) -> None:
    if not waiter.done():
        waiter.set_result(_EXPIRED)
