"""Fixtures shared by the gateway tests: a scripted upstream for the relays, and for the end-to-end
tests (a module defines `gateway`, its `specgate serve`) its served model id and an `openai` client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from backends.testbed import GatewayProcess, start_gateway
from gateway.upstream.connection_pool import WirePool
from gateway.upstream.http11 import WireResponse


def serving(env: dict[str, str]) -> Iterator[GatewayProcess]:
    """`specgate serve` on its embedded default with `env` (one worker unless `env` says otherwise, not
    one per core of the machine that runs the tests), stopped when the fixture ends."""
    gw = start_gateway(env={"SPECGATE_SERVER__WORKERS": "1", **env})
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def model(gateway: GatewayProcess) -> str:
    return httpx.get(gateway.url + "/v1/models").json()["data"][0]["id"]  # type: ignore[no-any-return]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[list[bytes], bool], Any]]:
    """Serve a scripted list of raw writes; `hang=True` then never finishes."""
    script: dict[str, Any] = {}
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in script["parts"]:
            await resp.write(part)
        if script["hang"]:
            await release.wait()
        return resp

    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    pool = WirePool(f"http://127.0.0.1:{port}", headers={}, connect_timeout=5, first_byte_timeout=5, max_connections=4)

    async def open_stream(parts: list[bytes], hang: bool = False) -> WireResponse:
        script.update(parts=parts, hang=hang)
        return await pool.post("/", b"{}")

    yield open_stream
    release.set()
    await pool.close()
    await runner.cleanup()
