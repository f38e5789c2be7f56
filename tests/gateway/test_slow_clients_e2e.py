"""Slow and greedy clients against `specgate serve` with two workers (the HTTP protocol is each worker's).

Short client timeouts (1 s); the thousands-of-connections version is tests/reliability/test_slow_clients.py.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from backends.testbed import SimFactory
from tests.reliability.attack import SLOW_HEAD, closed, connection_counts, hold_open, slow_body
from tests.reliability.stack import running_stack, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TIMEOUT = 1.0
WORKERS = 2  # on purpose: every worker's protocol bounds its clients, and the cap counts them together


async def test_slow_clients_are_closed_on_every_path_while_a_stream_completes(sims: SimFactory) -> None:
    limits = {"client_header_timeout_seconds": TIMEOUT, "client_body_timeout_seconds": TIMEOUT}
    async with running_stack(sims, time_scale=0.1, gateway={"limits": limits}, workers=WORKERS) as stack:
        # Each sample counts its own connection, and the stack's session keeps one alive on one of the
        # workers (30 s): six samples that all reach the other worker would read 1 where that one reads 2.
        idle = max(*await connection_counts(stack.url, 6), 2)
        fast, full = slow_body("/v1/chat/completions"), slow_body("/v1/responses")  # the raw-ASGI fast path, a FastAPI route
        held = await hold_open(stack.url, [SLOW_HEAD] * 300 + [fast] * 20 + [full] * 20)
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=40, stream=True
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
        assert chunks[-1].choices[0].finish_reason == "length"
        await closed(held, TIMEOUT + 9)
        assert {h.status for h in held} == {408}
        assert min(h.closed_at - h.sent_at for h in held if h.closed_at is not None) >= TIMEOUT * 0.9
        assert await stack.inflight() == 0
        assert await stack.metric("specgate_client_timeouts_total", phase="head") == 300
        assert await stack.metric("specgate_client_timeouts_total", phase="body") == 40
        await until(lambda: _all_at_most(stack.url, idle), 10, f"client_connections back to {idle}")
        status = await stack.get_json(stack.url + "/admin/status")
        assert {k: status["limits"][k] for k in ("client_header_timeout_seconds", "client_body_timeout_seconds",
                                                   "max_connections_per_client")} == {**limits, "max_connections_per_client": 0}


async def _all_at_most(url: str, idle: int) -> bool:
    return all(count <= idle for count in await connection_counts(url, 6))


CAP = 4


async def test_connections_over_the_per_client_cap_are_refused_across_workers(sims: SimFactory) -> None:
    async with running_stack(sims, time_scale=0.1, gateway={"limits": {"max_connections_per_client": CAP}}, workers=WORKERS) as stack:
        await stack.session.close()  # its kept-alive connections would count against the cap
        host, port = stack.url.removeprefix("http://").rsplit(":", 1)
        kept = []
        for _ in range(CAP):  # each served, then kept open (spread over the workers as they accept)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            kept.append((reader, writer))
        refused = await _ask(host, int(port), b"/health")
        assert refused == b""  # closed at once, whichever worker accepted it
        reader, writer = kept.pop()
        writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")  # on a connection it holds
        async with asyncio.timeout(10):
            metrics = await reader.read(-1)
        assert b"\nspecgate_client_connections_refused_total 1.0\n" in metrics
        for _, writer in kept:
            writer.close()
        async with asyncio.timeout(10):  # the connections it held are released as the workers see them close
            while not (await _ask(host, int(port), b"/health")).startswith(b"HTTP/1.1 200 "):
                await asyncio.sleep(0.05)


async def _ask(host: str, port: int, path: bytes) -> bytes:
    """GET `path` on a new connection; everything the gateway sends before it closes (b"": refused,
    by a close or, the request being unread, a reset)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET " + path + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    try:
        async with asyncio.timeout(10):
            return await reader.read(-1)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()
