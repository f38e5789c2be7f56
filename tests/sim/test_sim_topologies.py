"""Colocated mode (one GPU timeline for both roles) and the single adaptive server role."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.sim.profiles import load_profile
from tests.sim.closedloop import closed_loop
from tests.simproc import SimFactory


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.simtiming
async def test_colocated_roles_slow_each_other(sims: SimFactory) -> None:
    sim = sims.start("--colocated", "--time-scale", "0.2", "--enable-metrics")
    eagle, plain = sim.url("eagle"), sim.url("plain")
    async with httpx.AsyncClient() as http:
        assert 'pool="eagle"' in (await http.get(eagle + "/metrics")).text
        assert 'pool="plain"' in (await http.get(plain + "/metrics")).text

    eagle_alone = await closed_loop(eagle, 4, 128, min_seconds=1.0)
    plain_alone = await closed_loop(plain, 32, 128, min_seconds=1.0)
    eagle_shared, plain_shared = await asyncio.gather(
        closed_loop(eagle, 4, 128, min_seconds=1.0), closed_loop(plain, 32, 128, min_seconds=1.0)
    )
    # Steps alternate on the one timeline: each role gets roughly its step's share of the GPU.
    profile = load_profile("field-8gpu")
    te, tp = profile.eagle.step_ms(4), profile.plain.step_ms(32)
    assert eagle_shared.output_tok_s / eagle_alone.output_tok_s == pytest.approx(te / (te + tp), abs=0.15)
    assert plain_shared.output_tok_s / plain_alone.output_tok_s == pytest.approx(tp / (te + tp), abs=0.15)
    assert eagle_shared.output_tok_s < 0.75 * eagle_alone.output_tok_s
    assert plain_shared.output_tok_s < 0.75 * plain_alone.output_tok_s


@pytest.mark.simtiming
async def test_adaptive_role_drafts_at_low_batch_and_pays_the_tax_when_off(sims: SimFactory) -> None:
    profile = load_profile("field-8gpu")
    sim = sims.start("--role", "adaptive", "--time-scale", "0.1", "--enable-metrics")
    async with httpx.AsyncClient() as http:
        info = (await http.get(sim.url() + "/server_info")).json()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_adaptive"] is True
    assert info["max_running_requests"] == 256 and info["max_total_tokens"] == profile.eagle.max_total_tokens

    async def run(concurrency: int) -> tuple[float, float]:
        loop = asyncio.create_task(closed_loop(sim.url(), concurrency, 256, min_seconds=1.0))
        await asyncio.sleep(0.25)
        async with httpx.AsyncClient() as http:
            steps = metric_value((await http.get(sim.url() + "/metrics")).text, "sglang:spec_num_steps")
        return (await loop).output_tok_s * 0.1, steps

    low, low_steps = await run(1)
    assert low_steps == 3
    assert low == pytest.approx(profile.closed_loop_throughput("adaptive", 1, 256, 16), rel=0.1)
    assert low > profile.closed_loop_throughput("plain", 1, 256, 16)

    high, high_steps = await run(8)
    assert high_steps == 0  # past adaptive_off_batch (3): no drafting
    assert high == pytest.approx(profile.closed_loop_throughput("adaptive", 8, 256, 16), rel=0.1)
    assert high < 0.98 * profile.closed_loop_throughput("plain", 8, 256, 16)  # the draft model's cost stays
