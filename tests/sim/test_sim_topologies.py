"""Colocated mode (one GPU timeline for both roles) and the single adaptive server role."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.sim.profiles import load_profile
from backends.testbed import SimFactory
from loadtest.steady_rate import best_closed_loop
from tests.sim.steprates import metric_value, step_rates


@pytest.mark.simtiming
async def test_colocated_roles_slow_each_other(sims: SimFactory) -> None:
    sim = sims.start("--colocated", "--time-scale", "0.2", "--enable-metrics")
    eagle, plain = sim.url("eagle"), sim.url("plain")
    async with httpx.AsyncClient(timeout=30) as http:
        assert 'pool="eagle"' in (await http.get(eagle + "/metrics")).text
        assert 'pool="plain"' in (await http.get(plain + "/metrics")).text
        alone_e = (await step_rates(http, {"eagle": (eagle, 4)}, 0.8))["eagle"]
        alone_p = (await step_rates(http, {"plain": (plain, 32)}, 0.8))["plain"]
        shared = await step_rates(http, {"eagle": (eagle, 4), "plain": (plain, 32)}, 0.8)

    profile = load_profile("field-8gpu")
    te, tp = profile.eagle.step_ms(4) * 0.2 / 1000, profile.plain.step_ms(32) * 0.2 / 1000
    assert alone_e == pytest.approx(1 / te, rel=0.1) and alone_p == pytest.approx(1 / tp, rel=0.1)
    # On the one timeline the roles take turns: one step each per round of te + tp.
    assert shared["eagle"] == pytest.approx(shared["plain"], rel=0.05)
    assert shared["eagle"] == pytest.approx(1 / (te + tp), rel=0.1)
    assert shared["eagle"] / alone_e == pytest.approx(te / (te + tp), abs=0.08)
    assert shared["plain"] / alone_p == pytest.approx(tp / (te + tp), abs=0.08)


@pytest.mark.simtiming
async def test_adaptive_role_drafts_at_low_batch_and_pays_the_tax_when_off(sims: SimFactory) -> None:
    profile = load_profile("field-8gpu")
    # Time scale 0.5: at concurrency 1 each request's round trip is a gap in the closed loop, and
    # at 0.1 a contended machine's few ms of it would be a tenth of the request.
    scale, tokens = 0.5, 128
    adaptive = sims.start("--role", "adaptive", "--time-scale", str(scale), "--enable-metrics").url()
    plain = sims.start("--role", "plain", "--time-scale", str(scale)).url()
    async with httpx.AsyncClient() as http:
        info = (await http.get(adaptive + "/server_info")).json()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_adaptive"] is True
    assert info["max_running_requests"] == 256 and info["max_total_tokens"] == profile.eagle.max_total_tokens

    async def run(concurrency: int) -> tuple[float, float, float]:
        """Adaptive throughput (best of two, at time scale 1), its draft steps mid-run, plain's throughput."""
        loop = asyncio.create_task(best_closed_loop(adaptive, concurrency, tokens, min_seconds=0.6))
        await asyncio.sleep(0.25)
        async with httpx.AsyncClient() as http:
            steps = metric_value((await http.get(adaptive + "/metrics")).text, "sglang:spec_num_steps")
        mine = (await loop).output_tok_s * scale
        return mine, steps, (await best_closed_loop(plain, concurrency, tokens, min_seconds=0.6)).output_tok_s * scale

    # Noise only slows a sim: at most 5% above its model, at most 12% below.
    low, low_steps, low_plain = await run(1)
    assert low_steps == 3
    assert 0.88 <= low / profile.closed_loop_throughput("adaptive", 1, tokens, 16) <= 1.05
    assert low > 1.1 * low_plain  # modelled 1.21x: drafting pays

    high, high_steps, high_plain = await run(8)
    assert high_steps == 0  # past adaptive_off_batch (3): no drafting
    assert 0.88 <= high / profile.closed_loop_throughput("adaptive", 8, tokens, 16) <= 1.05
    assert high < 0.98 * high_plain  # modelled 0.93x: the draft model's cost stays
