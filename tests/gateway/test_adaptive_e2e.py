"""End to end: `specgate serve` with its default policy (adaptive) in front of its simulated
field-8gpu backends.

Driven with the real `openai` client in closed loops at concurrency 1 and 8. The policy must
learn from the streamed responses that speculation pays only for a lone request (the profile's
crossover is ~1.7), route accordingly, and show what it believes on /admin/status and /metrics.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from backends.sim.profiles import load_profile
from backends.testbed import GatewayProcess
from gateway.policies.adaptive.policy import OUTPUT_RATE, REUSE_HORIZON
from tests.gateway.chat_load import closed_loop, default_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    yield from default_gateway()


async def test_learns_the_crossover_and_routes_by_it(gateway: GatewayProcess) -> None:
    await closed_loop(gateway, 2, 12)  # both backends measured
    lone = await closed_loop(gateway, 1, 30)
    assert lone["eagle"] >= 26, lone  # a lone request speculates (probes aside)
    busy = await closed_loop(gateway, 8, 64)
    # At 8 in flight the two servers' TPOT are equal near 3 on EAGLE, 5 on plain (field-8gpu);
    # either way both serve, and plain most.
    assert busy["plain"] > busy["eagle"] > 0, busy

    async with httpx.AsyncClient(base_url=gateway.url) as http:
        status = (await http.get("/admin/status")).json()["policy"]
        metrics = (await http.get("/metrics")).text
    assert status["name"] == "adaptive"
    beliefs = status["beliefs"]
    assert 0.7 <= beliefs["crossover_concurrency"] <= 4.0, beliefs
    fits = beliefs["backends"]
    assert fits["eagle"]["speculative"] is True and fits["plain"]["speculative"] is False
    # The steeper curve is EAGLE's: verify-heavy steps cost more per request (calibration.md: 2.8 vs 1.3 ms).
    assert _rise(fits["eagle"]["points"]) > _rise(fits["plain"]["points"]) > 0, fits
    assert set(beliefs["predicted_tpot_seconds"]) == {"eagle", "plain"}

    for backend in ("eagle", "plain"):
        assert re.search(rf'specgate_policy_predicted_tpot_seconds{{backend="{backend}"}} [0-9.e-]+', metrics)
    assert re.search(r"^specgate_policy_crossover_concurrency [0-9.e+-]+$", metrics, re.MULTILINE)
    reasons = set(re.findall(r'specgate_route_decisions_total{backend="\w+",reason="(\w+)"}', metrics))
    assert "adaptive_predicted_faster" in reasons
    known = {"adaptive_predicted_faster", "adaptive_explore", "adaptive_prior", "adaptive_cap", "adaptive_group_switch", "adaptive_group_stay"}
    assert reasons <= known, reasons


async def test_learns_from_reported_cached_tokens_how_far_prompts_build_on_each_other(gateway: GatewayProcess) -> None:
    """A conversation whose turns re-send its history: each turn's reported `cached_tokens` reach the
    policy, which learns the prefill cost and the reuse its prefix routing prices (docs/adaptive.md, rule 4)."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        before = (await http.get("/admin/status")).json()["policy"]["beliefs"]
        # Streamed: a stream's decode window is what the policy learns from.
        shares = await conversation(gateway, "You answer in one careful line. ", 6, stream=True, route="plain")
        after = (await http.get("/admin/status")).json()["policy"]["beliefs"]
    # This conversation's first turn was not found cached, each later one almost all.
    assert shares[0] < 0.1 and min(shares[1:]) > 0.9, (before, shares)
    assert after["prefix_hit_share"] == pytest.approx(taught_share(before, shares), abs=1e-6)
    held = after["prefix_hit_share"]
    assert after["prefix_reuse"] == pytest.approx(min(held / (1.0 - held), REUSE_HORIZON))
    assert after["prefill_seconds_per_token"]["plain"] > 0.0  # from the first turn's long uncached prompt


async def test_answers_not_streamed_teach_the_share_found_cached_and_the_engines_their_prefill_cost(
    gateway: GatewayProcess,
) -> None:
    """Non-streamed turns teach what their usage says (the share found cached), and each engine's own
    prefill counters (`/v1/loads`, polled every second) teach its kind's prefill cost, no stream needed."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        before = (await http.get("/admin/status")).json()["policy"]["beliefs"]
        # Routed by the policy: every routing reads the engines' latest counters.
        shares = await conversation(gateway, "You answer in two short words. ", 4, stream=False)
        after = (await http.get("/admin/status")).json()["policy"]["beliefs"]
        assert after["prefix_hit_share"] == pytest.approx(taught_share(before, shares), abs=1e-6), (before, shares)
        api = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        model = (await api.models.list()).data[0].id
        # Fresh prompts of a few hundred uncached tokens on each server, then one the policy routes
        # (where the engines' latest counters are read), until both kinds' counters moved enough to
        # read: each kind's cost is then its profile's, at the time scale.
        profile = load_profile("field-8gpu")
        deadline = asyncio.get_running_loop().time() + 60
        sent = 0
        while set(after["engine_prefill_seconds_per_token"]) != {"eagle", "plain"}:
            assert asyncio.get_running_loop().time() < deadline, after
            for route in ("eagle", "plain", None):
                sent += 1
                fresh = [{"role": "user", "content": f"Question {sent}: " + f"fresh word {sent} " * 100}]
                route_header = {"x-specgate-route": route} if route else None
                await api.chat.completions.create(model=model, messages=fresh, max_tokens=2, extra_headers=route_header)  # type: ignore[arg-type]
            after = (await http.get("/admin/status")).json()["policy"]["beliefs"]
        await api.close()
    for kind, table in (("eagle", profile.eagle), ("plain", profile.plain)):
        assert after["engine_prefill_seconds_per_token"][kind] == pytest.approx(table.prefill_ms_per_token / 1000 * 0.5, rel=0.02)
    # With that cost known, the pool's count of the prompt tokens each routed request was sent to prefill
    # prices the prefill a request in flight brings its group (docs/adaptive.md, rule 3).
    assert after["prefilling_per_request"] > 0.0, after


async def conversation(gateway: GatewayProcess, system: str, turns: int, *, stream: bool, route: str | None = None) -> list[float]:
    """A conversation of `turns` re-sending its history under a long system prompt (`system` x 120), each
    turn streamed or answered whole (to `route`, or where the policy sends it); each turn's share of its
    prompt the backend reported cached."""
    api = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = (await api.models.list()).data[0].id
    messages = [{"role": "system", "content": system * 120}, {"role": "user", "content": "Hi."}]
    headers = {"x-specgate-route": route} if route else None
    shares = []
    for _ in range(turns):
        if stream:
            chunks = [chunk async for chunk in await api.chat.completions.create(
                model=model, messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
                extra_headers=headers,
            )]
            usage = chunks[-1].usage
            answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            whole = await api.chat.completions.create(model=model, messages=messages, max_tokens=8, extra_headers=headers)  # type: ignore[arg-type]
            usage, answer = whole.usage, whole.choices[0].message.content or ""
        assert usage is not None and usage.prompt_tokens_details is not None
        shares.append((usage.prompt_tokens_details.cached_tokens or 0) / usage.prompt_tokens)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More."}]
    await api.close()
    return shares


def taught_share(before: dict[str, Any], shares: list[float]) -> float:
    """The share of prompts found cached the policy believes after `shares`, from what it believed `before`."""
    expected = float(before["prefix_hit_share"])
    for share in shares:
        expected += OUTPUT_RATE * (share - expected)
    return expected


def _rise(points: list[list[float]]) -> float:
    """Seconds per token added per request in flight, from the first measured point to the last."""
    (n0, y0), (n1, y1) = points[0], points[-1]
    return (y1 - y0) / (n1 - n0)
