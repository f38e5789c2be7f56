"""End to end: `specgate serve` with its default policy (adaptive) in front of its simulated
field-8gpu backends, sent answers that are never streamed.

No response has chunk times, so each backend's curve is learned from its engine's own decode
step-time moments on `/v1/loads` (polled every second). Driven with the real `openai` client; the policy must learn that speculation
pays only for a lone request (the profile's crossover is ~1.7) and route by it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    gw = start_gateway(env={"SPECGATE_LAUNCH__TIME_SCALE": "0.5", "SPECGATE_SERVER__WORKERS": "1"})  # no --policy: the default
    try:
        yield gw
    finally:
        gw.stop()


async def answered(gateway: GatewayProcess, concurrency: int, requests: int) -> Counter[str]:
    """`requests` chats answered whole (not streamed) from `concurrency` workers; how many each backend served."""
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id
    served: Counter[str] = Counter()
    remaining = iter(range(requests))

    async def worker() -> None:
        for i in remaining:
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": f"Tell me story {i}."}], max_tokens=96
            )
            assert raw.parse().usage is not None
            served[raw.headers["x-specgate-backend"]] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return served


async def beliefs(gateway: GatewayProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        return (await http.get("/admin/status")).json()["policy"]["beliefs"]


async def test_learns_the_crossover_from_the_engines_when_no_answer_is_streamed(gateway: GatewayProcess) -> None:
    # Lone requests until both curves are fitted from the engines' steps (the idle plain server is
    # measured by the cold start's probes): each backend's steps are read once a poll shows 16 more.
    deadline = asyncio.get_running_loop().time() + 120
    known = await beliefs(gateway)
    while not all(b["points"] for b in known["backends"].values()) or len(known["backends"]) < 2:
        assert asyncio.get_running_loop().time() < deadline, known
        await answered(gateway, 1, 10)
        known = await beliefs(gateway)
    lone = await answered(gateway, 1, 30)
    assert lone["eagle"] >= 26, lone  # a lone request speculates (probes aside)
    busy = await answered(gateway, 8, 96)
    assert busy["plain"] > busy["eagle"], busy

    known = await beliefs(gateway)
    fits = known["backends"]
    assert fits["eagle"]["tau"] > 1.5 and fits["plain"]["tau"] == 1.0, fits  # from the engines' tokens per request-step
    assert 0.7 <= known["crossover_concurrency"] <= 4.0, known
    assert all(b["observations"] >= 2 for b in fits.values()), fits  # no stream taught anything: the engines did
