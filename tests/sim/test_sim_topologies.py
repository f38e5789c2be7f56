"""Colocated mode (one GPU timeline for both roles) and the single adaptive server role."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.sim.profiles import load_profile
from tests.sim.closedloop import best_closed_loop, closed_loop
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
    adaptive = sims.start("--role", "adaptive", "--time-scale", "0.1", "--enable-metrics").url()
    plain = sims.start("--role", "plain", "--time-scale", "0.1").url()
    async with httpx.AsyncClient() as http:
        info = (await http.get(adaptive + "/server_info")).json()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_adaptive"] is True
    assert info["max_running_requests"] == 256 and info["max_total_tokens"] == profile.eagle.max_total_tokens

    async def run(concurrency: int) -> tuple[float, float, float]:
        """Adaptive throughput (best of two, at time scale 1), its draft steps mid-run, plain's throughput."""
        loop = asyncio.create_task(best_closed_loop(adaptive, concurrency, 256, min_seconds=0.6))
        await asyncio.sleep(0.25)
        async with httpx.AsyncClient() as http:
            steps = metric_value((await http.get(adaptive + "/metrics")).text, "sglang:spec_num_steps")
        mine = (await loop).output_tok_s * 0.1
        return mine, steps, (await best_closed_loop(plain, concurrency, 256, min_seconds=0.6)).output_tok_s * 0.1

    # Noise only slows a sim: at most 5% above its model, at most 12% below.
    low, low_steps, low_plain = await run(1)
    assert low_steps == 3
    assert 0.88 <= low / profile.closed_loop_throughput("adaptive", 1, 256, 16) <= 1.05
    assert low > 1.1 * low_plain  # modelled 1.21x: drafting pays

    high, high_steps, high_plain = await run(8)
    assert high_steps == 0  # past adaptive_off_batch (3): no drafting
    assert 0.88 <= high / profile.closed_loop_throughput("adaptive", 8, 256, 16) <= 1.05
    assert high < 0.98 * high_plain  # modelled 0.93x: the draft model's cost stays
