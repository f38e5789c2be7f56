"""One long-lived, pooled HTTP client per backend.

Generation requests (and the small POSTs relayed beside them) share one pool of the gateway's own
HTTP/1.1 client (`connection_pool.py`) capped at `max_connections`; a burst beyond it queues for a
free connection, bounded by the connect timeout, and a queue that does not move within it is the
gateway's overload (`LocalResourceError`), not a dead backend. Health probes and info GETs get a
small aiohttp pool of their own, so they never wait behind a full generation pool (why generation
does not use aiohttp: docs/benchmarks/gateway-overhead.md, "aiohttp vs the wire client").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import aiohttp
import orjson

from gateway.config import TimeoutConfig
from gateway.upstream.connection_pool import WirePool
from gateway.upstream.errors import UpstreamStatusError
from gateway.upstream.http11 import WireResponse

_MANAGEMENT_CONNECTIONS = 4  # health probes, /v1/models, /server_info

class UpstreamClient:
    """HTTP access to one backend: generation requests and small JSON GETs."""

    def __init__(self, base_url: str, *, api_key: str | None, timeouts: TimeoutConfig, max_connections: int) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeouts = timeouts
        self._max_connections = max_connections
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._wire: WirePool | None = None
        self._management: aiohttp.ClientSession | None = None

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        # `connect` bounds the wait for a pooled connection plus the TCP connect itself.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, connect=self._timeouts.connect, sock_connect=self._timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def start(self) -> None:
        """Open the connection pools; call once from the running event loop."""
        self._wire = WirePool(
            self.base_url,
            headers=self._headers,
            connect_timeout=self._timeouts.connect,
            first_byte_timeout=self._timeouts.first_byte,
            max_connections=self._max_connections,
        )
        self._management = self._new_session(_MANAGEMENT_CONNECTIONS)

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._wire is not None:
            await self._wire.close()
        if self._management is not None:
            await self._management.close()
        self._wire = self._management = None

    @property
    def wire(self) -> WirePool:
        """The generation pool."""
        if self._wire is None:
            raise RuntimeError("upstream client not started")
        return self._wire

    @property
    def open_connections(self) -> int:
        """Sockets this client holds open (in use and idle, both pools): descriptors it owns."""
        total = 0 if self._wire is None else self._wire.open_connections
        connector = self._management.connector if self._management is not None else None
        if connector is not None:
            # aiohttp has no public count; `_acquired` holds connections in use, `_conns` idle ones.
            total += len(getattr(connector, "_acquired", ()))
            total += sum(len(idle) for idle in getattr(connector, "_conns", {}).values())
        return total

    @property
    def pool_full(self) -> bool:
        """True while every connection the generation pool may hold is in use."""
        return self.wire.full

    def post(self, path: str, body: bytes, headers: bytes = b"") -> Awaitable[WireResponse]:
        """Send a generation request (`headers`: whole head lines of its own, e.g. its trace context);
        returns once the response headers arrived.

        SGLang holds the headers of a stream until its first chunk exists, so this wait covers
        queueing and prefill and is bounded by the first-byte timeout. The caller owns the
        response and must close or release it. Raises `ConnectFailed` when no response byte came
        (safe to fail over), `BadResponse` for an answer that is not HTTP, TimeoutError past the
        first-byte timeout, and `LocalResourceError` when the pool was full and no connection came
        free within the connect timeout.
        """
        return self.wire.post(path, body, headers)  # the pool's coroutine itself: no extra frame per request

    async def get(self, path: str, timeout: float, *, auth: bool = True) -> tuple[int, bytes, str]:
        """GET a small resource; returns (status, body, content type)."""
        headers = self._headers if auth else None
        if self._management is None:
            raise RuntimeError("upstream client not started")
        async with asyncio.timeout(timeout):
            async with self._management.get(self.base_url + path, headers=headers) as resp:
                return resp.status, await resp.read(), resp.headers.get("Content-Type", "application/json")

    async def fetch(self, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes, str]:
        """A small non-generation call: GET when `body` is None (bounded by `timeout`), else POST it
        (bounded like any request sent upstream); (status, body, content type)."""
        if body is None:
            return await self.get(path, timeout)
        resp = await self.post(path, body)
        try:
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "application/json")
        finally:
            resp.release()

    async def get_json(self, path: str, timeout: float) -> Any:
        """GET and decode JSON; raises on a non-200 status."""
        status, body, _ = await self.get(path, timeout)
        if status != 200:
            raise UpstreamStatusError(f"GET {path} answered {status}")
        return orjson.loads(body)
