"""Open-loop arrivals: Poisson at a rate, burstier or smoother with gamma gaps (vLLM's --burstiness)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from loadtest.results import LevelResult
from loadtest.workloads.arrivals import arrivals, stepped_arrivals
from loadtest.workloads.level import Level, RateStep
from loadtest.workloads.workload import Workload


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *offsets], offsets)]


def test_poisson_arrivals_have_the_requested_mean_rate() -> None:
    offsets = arrivals(50.0, 4000, random.Random(1))
    assert statistics.mean(gaps(offsets)) == pytest.approx(1 / 50.0, rel=0.05)
    assert offsets == sorted(offsets)


def test_poisson_arrivals_are_the_draws_the_sweep_always_made() -> None:
    # Committed open-loop results were drawn with these exponential gaps from random.Random(seed).
    assert arrivals(4.0, 3, random.Random(0)) == pytest.approx([0.46515177776630584, 0.8198090660092463, 0.9562373523946445])


def test_infinite_rate_and_offset_start() -> None:
    assert arrivals(math.inf, 3, random.Random(0), start=2.0) == [2.0, 2.0, 2.0]
    assert arrivals(math.inf, 2, random.Random(0), burstiness=0.2) == [0.0, 0.0]
    assert min(arrivals(10.0, 10, random.Random(0), start=5.0)) > 5.0


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_keep_the_mean_rate_and_have_a_coefficient_of_variation_of_one_over_sqrt_b(burstiness: float) -> None:
    sample = gaps(arrivals(20.0, 20000, random.Random(7), burstiness=burstiness))
    assert statistics.mean(sample) == pytest.approx(1 / 20.0, rel=0.05)
    cv = statistics.stdev(sample) / statistics.mean(sample)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0), (1.0, -0.5)])
def test_rates_and_burstiness_must_be_positive(rate: float, burstiness: float) -> None:
    with pytest.raises(ValueError):
        arrivals(rate, 1, random.Random(0), burstiness=burstiness)


def test_a_rate_step_offers_low_then_high_then_low_for_its_seconds_each() -> None:
    step = RateStep(5.0, 20.0, 60.0)
    assert step.requests == 1800 and Level(rate_step=step).label == "step 5-20/s x60s"
    offsets = stepped_arrivals(step, step.requests, random.Random(3))
    assert len(offsets) == 1800
    per_phase = [sum(1 for t in offsets if k * 60.0 <= t < (k + 1) * 60.0) for k in range(3)]
    # 300, 1200 and 300 sessions drawn from each phase's start; a phase's last few spill into the next.
    assert per_phase[0] == pytest.approx(300, abs=30) and per_phase[1] == pytest.approx(1200, abs=60)
    assert per_phase[2] == pytest.approx(300, abs=30)


def test_a_rate_step_level_plans_its_schedule_and_survives_results_json() -> None:
    step = RateStep.parse("2,8,30")
    plan = Workload(seed=4).plan(Level(rate_step=step), 0)
    assert plan.requests == 360 and plan.concurrency is None and plan.offered_request_s == pytest.approx(4.0)
    assert 85.0 < max(s.start_s for s in plan.sessions) < 100.0  # three phases of 30 s
    with pytest.raises(ValueError):
        RateStep.parse("2,8")
    level = LevelResult(None, None, 360, {}, offered_request_s=4.0, rate_step=step)
    again = LevelResult.from_json(level.to_json())
    assert again.rate_step == step and again.label == "step 2-8/s x30s" and again.x == 4.0
