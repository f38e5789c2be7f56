"""One long-lived, pooled HTTP client per backend.

aiohttp, not httpx: relaying 256 concurrent streams it used markedly less CPU per chunk; see
`benchmarks/upstream_clients.py` and docs/benchmarks/upstream-clients.md for the measurement.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from gateway.config import TimeoutConfig


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

    async def start(self) -> None:
        """Open the connection pool; call once from the running event loop."""
        connector = aiohttp.TCPConnector(limit=self._max_connections, enable_cleanup_closed=True)
        # Timeouts that depend on the phase (first byte vs between chunks) are applied per call.
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("upstream client not started")
        return self._session

    async def post(self, path: str, body: bytes) -> aiohttp.ClientResponse:
        """Send a generation request; returns once the response headers arrived.

        SGLang holds the headers of a stream until its first chunk exists, so this wait covers
        queueing and prefill and is bounded by the first-byte timeout. The caller owns the
        response and must close or release it.
        """
        async with asyncio.timeout(self._timeouts.first_byte):
            return await self.session.post(self.base_url + path, data=body, headers=self._headers)

    async def get(self, path: str, timeout: float, *, auth: bool = True) -> tuple[int, bytes, str]:
        """GET a small resource; returns (status, body, content type)."""
        headers = self._headers if auth else None
        async with asyncio.timeout(timeout):
            async with self.session.get(self.base_url + path, headers=headers) as resp:
                return resp.status, await resp.read(), resp.headers.get("Content-Type", "application/json")

    async def get_json(self, path: str, timeout: float) -> Any:
        """GET and decode JSON; raises on a non-200 status."""
        status, body, _ = await self.get(path, timeout)
        if status != 200:
            raise UpstreamStatusError(f"GET {path} answered {status}")
        return orjson.loads(body)
