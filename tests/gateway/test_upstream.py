"""The per-backend HTTP client: what it sends, its first-byte bound, and its errors."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import TimeoutConfig
from gateway.upstream.client import UpstreamClient
from gateway.upstream.errors import ConnectFailed, LocalResourceError, UpstreamStatusError, local_kind
from tests.gateway.fake_backend import MODEL, FakeBackend, refused_url, serving


async def started(url: str, *, api_key: str | None = "k", first_byte: float = 5.0) -> UpstreamClient:
    client = UpstreamClient(url + "/", api_key=api_key, timeouts=TimeoutConfig(first_byte=first_byte), max_connections=4)
    await client.start()
    return client


async def test_post_sends_the_key_and_json_and_returns_at_the_headers() -> None:
    async with serving(FakeBackend(mode="stall")) as fake:
        client = await started(fake.url)
        try:
            resp = await client.post("/v1/chat/completions", b"{}")  # returns although the body never ends
            assert resp.status == 200
            resp.close()
        finally:
            await client.close()
        sent = fake.headers[0]
        assert sent["Authorization"] == "Bearer k" and sent["Content-Type"] == "application/json"
        assert "User-Agent" not in sent


async def test_post_gives_up_at_the_first_byte_timeout() -> None:
    async with serving(FakeBackend(mode="hang")) as fake:
        client = await started(fake.url, first_byte=0.2)
        try:
            with pytest.raises(TimeoutError):
                await client.post("/v1/chat/completions", b"{}")
        finally:
            await client.close()


async def test_a_refused_connection_is_a_connection_error() -> None:
    client = await started(refused_url())
    try:
        with pytest.raises(ConnectFailed):
            await client.post("/v1/chat/completions", b"{}")
    finally:
        await client.close()


async def test_get_json_decodes_and_refuses_other_statuses() -> None:
    async with serving(FakeBackend(ready_status=503)) as fake:
        client = await started(fake.url, api_key=None)
        try:
            assert (await client.get_json("/v1/models", 5.0))["data"][0]["id"] == MODEL
            assert "Authorization" not in fake.headers[-1]
            with pytest.raises(UpstreamStatusError):
                await client.get_json("/ready", 5.0)
        finally:
            await client.close()


async def test_unstarted_or_closed_client_refuses_to_send() -> None:
    client = UpstreamClient("http://127.0.0.1:9", api_key=None, timeouts=TimeoutConfig(), max_connections=1)
    with pytest.raises(RuntimeError):
        await client.post("/x", b"")
    await client.start()
    await client.close()
    with pytest.raises(RuntimeError):
        await client.get("/x", 1.0)


async def test_a_pool_that_stays_full_past_the_connect_timeout_is_a_local_resource_error() -> None:
    async with serving(FakeBackend(mode="hang")) as fake:
        timeouts = TimeoutConfig(connect=0.2, first_byte=30)
        client = UpstreamClient(fake.url, api_key=None, timeouts=timeouts, max_connections=1)
        await client.start()
        holder = asyncio.create_task(client.post("/v1/chat/completions", b"{}"))  # holds the only connection
        try:
            async with asyncio.timeout(10):
                while fake.posts == 0:
                    await asyncio.sleep(0.01)
            assert client.pool_full and client.open_connections == 1
            with pytest.raises(LocalResourceError) as caught:
                await client.post("/v1/chat/completions", b"{}")
            assert caught.value.kind == "pool_full" and local_kind(caught.value) == "pool_full"
            # Probes have a pool of their own: a full generation pool does not delay them.
            status, _, _ = await client.get("/ready", 1.0, auth=False)
            assert status == 200
        finally:
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            await client.close()
