"""Emptying servers' prefix caches before each target meets a level, where targets share servers.

`envelope --compare single` sweeps `eagle` and `plain` directly and `specgate` through the gateway in
front of those very servers, and `sweep --flush-cache` any targets that share servers, level by level
and, within a level, target after target: a later target would find the level's prompts (a
shared-prefix group's system prompt, a conversation's history) cached by an earlier target's run. So
before every target's run of every level each server gets SGLang's `POST /flush_cache` (a gateway
passes it to its backends), which a server refuses (400) while requests wait or run: one that its
client already saw end may still be leaving the server, so a refusal is retried until the server is
idle. Every target thus starts every level cold, its cache warmed by its own requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Self

import aiohttp

from loadtest.workloads.level import Level


class CacheFlush:
    """Flushes each URL's prefix cache when called (the sweep's `before_level` hook); an async context manager."""

    def __init__(
        self, urls: Sequence[str], timeout: float = 60.0, retry_interval: float = 0.05, api_key: str | None = None
    ) -> None:
        """`api_key`: sent as a bearer token (a server or gateway started with a key asks for it)."""
        self.urls = [u.rstrip("/") for u in dict.fromkeys(urls)]  # a server named by two targets is flushed once
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.api_key = api_key
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), headers=headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, target: str, level: Level) -> None:
        """Flush every URL's cache before `target` runs `level`."""
        for url in self.urls:
            await self.flush(url)

    async def flush(self, url: str) -> None:
        """`POST url/flush_cache` until it answers 200; RuntimeError on another answer or once `timeout` passed."""
        assert self._session is not None, "use CacheFlush as an async context manager"
        deadline = time.monotonic() + self.timeout
        while True:
            async with self._session.post(f"{url}/flush_cache") as resp:
                status, text = resp.status, await resp.text()
            if status == 200:
                return
            if status != 400:
                raise RuntimeError(f"{url}/flush_cache answered {status}: {text[:200]}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{url} still ran requests {self.timeout:g} s after the level; its cache was not flushed")
            await asyncio.sleep(self.retry_interval)
