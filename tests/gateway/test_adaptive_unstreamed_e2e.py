"""End to end: `specgate serve` with its default policy (adaptive) in front of its simulated
field-8gpu backends, sent answers that are never streamed.

No response has chunk times, so each backend's curve is learned from its engine's own decode
step-time moments on `/v1/loads` (polled every second). Driven with the real `openai` client; the
policy must learn that speculation pays only for a lone request (the profile's crossover is ~1.7)
and route by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.testbed import GatewayProcess
from tests.gateway.chat_load import closed_loop, default_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    yield from default_gateway()


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
        await closed_loop(gateway, 1, 10, stream=False)
        known = await beliefs(gateway)
    lone = await closed_loop(gateway, 1, 30, stream=False)
    assert lone["eagle"] >= 26, lone  # a lone request speculates (probes aside)
    busy = await closed_loop(gateway, 8, 96, stream=False)
    assert busy["plain"] > busy["eagle"], busy

    known = await beliefs(gateway)
    fits = known["backends"]
    assert fits["eagle"]["tau"] > 1.5 and fits["plain"]["tau"] == 1.0, fits  # from the engines' tokens per request-step
    assert 0.7 <= known["crossover_concurrency"] <= 4.0, known
    assert all(b["observations"] >= 2 for b in fits.values()), fits  # no stream taught anything: the engines did
