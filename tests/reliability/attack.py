"""Hostile clients: connections that send part of a request, then wait for the gateway to close them.

    held = await hold_open(stack.url, [SLOW_HEAD] * 3000 + [slow_body("/v1/chat/completions")] * 200)
    ...                                  # real traffic meanwhile
    await closed(held, within=15)        # each records when it was sent and closed, and what it got

Connections are opened in batches, each batch connected before the next, so the gateway's accept
queue is never what refuses them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

SLOW_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"  # slowloris: a request line, a header, then nothing
BATCH = 250


def slow_body(path: str) -> bytes:
    """A complete head declaring a body of 100,000 bytes, and one byte of it (a slow POST)."""
    return f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{".encode()


@dataclass
class Held:
    """One hostile connection: what it sent, when, and how the gateway ended it."""

    request: bytes
    sent_at: float = 0.0
    closed_at: float | None = None
    answer: bytes = b""  # everything the gateway sent before it closed the connection
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def status(self) -> int | None:
        """The status of the gateway's answer; None when it closed without one."""
        return int(self.answer.split(b" ", 2)[1]) if self.answer.startswith(b"HTTP/1.1 ") else None


async def _hold(host: str, port: int, held: Held, connected: asyncio.Event) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    finally:
        connected.set()
    writer.write(held.request)
    held.sent_at = time.monotonic()
    try:
        while chunk := await reader.read(65536):
            held.answer += chunk
    except ConnectionError:
        pass
    held.closed_at = time.monotonic()
    writer.close()


async def hold_open(url: str, requests: list[bytes]) -> list[Held]:
    """One connection per request in `requests`, each sending it and reading until the gateway closes."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    out = []
    for start in range(0, len(requests), BATCH):
        events = []
        for request in requests[start : start + BATCH]:
            held, connected = Held(request), asyncio.Event()
            held.task = asyncio.create_task(_hold(host, port, held, connected))
            out.append(held)
            events.append(connected)
        async with asyncio.timeout(30):
            await asyncio.gather(*(e.wait() for e in events))
    return out


async def closed(held: list[Held], within: float) -> None:
    """Wait until the gateway has closed every connection, at most `within` s after the last was sent."""
    tasks = [h.task for h in held if h.task is not None]
    deadline = max(h.sent_at for h in held) + within
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + max(deadline - time.monotonic(), 0.0)):
            await asyncio.gather(*tasks)
    except TimeoutError:
        still = sum(h.closed_at is None for h in held)
        for task in tasks:
            task.cancel()
        raise AssertionError(f"{still} of {len(held)} hostile connections still open {within} s after they were sent") from None


async def connection_counts(url: str, samples: int) -> list[int]:
    """`client_connections` from /admin/status, each on a new connection (so, with several workers, from any of them)."""
    counts = []
    for _ in range(samples):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            async with session.get(url + "/admin/status") as resp:
                counts.append(int((await resp.json())["limits"]["client_connections"]))
    return counts
