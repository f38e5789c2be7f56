"""Service tiers through the proxy and the routes, against a scripted backend: flex refused first,
what goes upstream (SGLang's `priority`, never `service_tier`), and the echo in a stream."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson

from gateway.app import create_app
from gateway.proxy.exchange import ProxyResponse
from gateway.proxy.job import ProxyJob
from gateway.runtime import Runtime
from gateway.tiers import DEFAULT, FLEX, Tier
from tests.gateway.fake_backend import MODEL, FakeBackend, serving
from tests.gateway.test_proxy import Exchange, gateway, inflight, sample


async def call(rt: Runtime, tier: Tier) -> Exchange:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    job = ProxyJob("chat", "/v1/chat/completions", body, True, False, None, "rid-1", time.monotonic(), tier=tier)
    exchange = Exchange()

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        exchange.messages.append(message)

    await ProxyResponse(rt, job)({"type": "http"}, receive, send)
    return exchange


async def test_flex_is_refused_first_under_overload() -> None:
    async with serving(FakeBackend()) as fake, gateway(fake.url, fake.url, limits={"max_inflight": 4}, policy={"tier_flex_inflight_share": 0.5}) as rt:
        held = [rt.pool.acquire("plain"), rt.pool.acquire("plain")]  # half the limit in flight
        refused = await call(rt, FLEX)
        assert refused.status == 429 and refused.error()["code"] == "overloaded"
        assert refused.headers["retry-after"] == "2" and refused.headers["x-specgate-service-tier"] == "flex"
        assert (await call(rt, DEFAULT)).status == 200  # the others still get in
        assert sample(rt, "specgate_tier_requests_total", tier="flex", status="429") == 1
        for slot in held:
            slot.release()
        assert (await call(rt, FLEX)).status == 200
        assert inflight(rt) == {"eagle": 0, "plain": 0}


async def post(rt: Runtime, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(rt)), base_url="http://gw") as client:
        return await client.post("/v1/chat/completions", json=body, headers=headers or {})


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_sglang_gets_its_priority_field_and_never_service_tier() -> None:
    fake = FakeBackend()
    async with serving(fake), gateway(fake.url, fake.url, policy={"tier_sglang_priority": True}) as rt:
        resp = await post(rt, {**CHAT, "service_tier": "priority"})
        assert resp.status_code == 200 and resp.headers["x-specgate-service-tier"] == "priority"
        chunks = [orjson.loads(line[6:]) for line in resp.text.split("\n\n") if line.startswith("data: {")]
        assert chunks and all(c["service_tier"] == "priority" for c in chunks)
        await post(rt, CHAT, {"x-specgate-service-tier": "flex"})
        await post(rt, CHAT)
        await post(rt, {**CHAT, "priority": 7})  # the client's own SGLang priority wins
        sent = [orjson.loads(b) for b in fake.bodies]
        assert [b.get("priority") for b in sent] == [1, -1, 0, 7]
        assert all("service_tier" not in b for b in sent)


async def test_without_sglang_priority_nothing_is_added() -> None:
    fake = FakeBackend()
    async with serving(fake), gateway(fake.url, fake.url) as rt:
        resp = await post(rt, CHAT)
        assert resp.status_code == 200 and "service_tier" not in resp.text
        assert "priority" not in orjson.loads(fake.bodies[0])
