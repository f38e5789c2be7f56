"""One long-lived, pooled HTTP client per backend.

Generation requests share one pool capped at `max_connections` (reused keep-alive connections);
a burst beyond it queues for a free connection, bounded by the connect timeout, rather than
opening a socket per request at once. A queue that does not move within that timeout is the
gateway's overload (`LocalResourceError`), not a dead backend. Health probes and info GETs get a
small pool of their own, so they never wait behind a full generation pool.

aiohttp, not httpx: relaying 256 concurrent streams it used markedly less CPU per chunk; see
`benchmarks/upstream_clients.py` and docs/benchmarks/upstream-clients.md for the measurement.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from gateway.config import TimeoutConfig
from gateway.local_errors import LocalResourceError

_MANAGEMENT_CONNECTIONS = 4  # health probes, /v1/models, /server_info


class UpstreamStatusError(Exception):
    """A backend answered a management request with a non-200 status."""


class UpstreamClient:
    """HTTP access to one backend: generation requests and small JSON GETs."""

    def __init__(self, base_url: str, *, api_key: str | None, timeouts: TimeoutConfig, max_connections: int) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeouts = timeouts
        self._max_connections = max_connections
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._management: aiohttp.ClientSession | None = None

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        # `connect` bounds the wait for a pooled connection plus the TCP connect itself; timeouts that
        # depend on the phase (first byte vs between chunks) are applied per call.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, connect=self._timeouts.connect, sock_connect=self._timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def start(self) -> None:
        """Open the connection pools; call once from the running event loop."""
        self._session = self._new_session(self._max_connections)
        self._management = self._new_session(_MANAGEMENT_CONNECTIONS)

    async def close(self) -> None:
        """Close every pooled connection."""
        for session in (self._session, self._management):
            if session is not None:
                await session.close()
        self._session = self._management = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("upstream client not started")
        return self._session

    @property
    def open_connections(self) -> int:
        """Sockets this client holds open (in use and idle, both pools): descriptors it owns."""
        total = 0
        for session in (self._session, self._management):
            connector = session.connector if session is not None else None
            if connector is not None:
                # aiohttp has no public count; `_acquired` holds connections in use, `_conns` idle ones.
                total += len(getattr(connector, "_acquired", ()))
                total += sum(len(idle) for idle in getattr(connector, "_conns", {}).values())
        return total

    @property
    def pool_full(self) -> bool:
        """True while every connection the generation pool may hold is in use."""
        connector = self.session.connector
        if connector is None or not connector.limit:
            return False
        # aiohttp exposes no public count of connections in use; `_acquired` is that set.
        return len(getattr(connector, "_acquired", ())) >= connector.limit

    async def post(self, path: str, body: bytes) -> aiohttp.ClientResponse:
        """Send a generation request; returns once the response headers arrived.

        SGLang holds the headers of a stream until its first chunk exists, so this wait covers
        queueing and prefill and is bounded by the first-byte timeout. The caller owns the
        response and must close or release it. Raises `LocalResourceError` when the pool was full
        and no connection came free within the connect timeout.
        """
        queued = self.pool_full
        try:
            async with asyncio.timeout(self._timeouts.first_byte):
                return await self.session.post(self.base_url + path, data=body, headers=self._headers)
        except aiohttp.ConnectionTimeoutError as exc:
            if queued:
                raise LocalResourceError(
                    "pool_full", f"no connection to {self.base_url} came free within {self._timeouts.connect:g} s"
                ) from exc
            raise

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
