"""The envelope's automatic time scale, for closed-loop and open-loop levels."""

from __future__ import annotations

import math

import pytest

from loadtest.envelope.timescale import LevelLoad, auto_time_scale, chunk_rate, open_loop_concurrency, profile_for
from loadtest.workloads.level import Level, RequestsPerLevel
from loadtest.workloads.workload import Workload

PROFILE = profile_for("llama8b-h100", None)


def test_closed_loop_levels_keep_the_scale_the_docs_quote() -> None:
    assert auto_time_scale(PROFILE, [1, 2, 4, 8, 16, 32, 64])[0] == 3.5  # docs/loadtest.md: 3.5 to 64 as one server
    assert auto_time_scale(PROFILE, [LevelLoad(concurrency=c) for c in (1, 64)]) == auto_time_scale(PROFILE, [1, 64])


def test_an_open_loop_level_holds_what_littles_law_says() -> None:
    plain = PROFILE.plain
    inflight = open_loop_concurrency(plain, 20.0, 128, 1000)
    decode_s = 128 / plain.tokens_per_step(inflight) * plain.step_ms(inflight) / 1000
    assert inflight == pytest.approx(20.0 * decode_s, abs=1.0)  # a fixed point: rate x time in the system
    assert open_loop_concurrency(plain, 0.01, 128, 1000) == 1
    assert open_loop_concurrency(plain, 1e6, 128, 300) == 300  # it cannot keep up: the whole level piles in
    assert open_loop_concurrency(plain, math.inf, 128, 40) == 40


def test_faster_rates_need_a_slower_clock_and_a_plan_says_what_it_offers() -> None:
    workload = Workload(output_len=128, requests_per_level=RequestsPerLevel(500))
    loads = [LevelLoad.of(workload.plan(Level(request_rate=r), 0)) for r in (5.0, 50.0)]
    assert loads[0] == LevelLoad(None, 5.0, 128.0, 500)
    low, high = (auto_time_scale(PROFILE, [load])[0] for load in loads)
    assert low < high
    assert LevelLoad(rate=50.0, mean_output=128, requests=500).chunk_rate(PROFILE.plain) == chunk_rate(
        PROFILE.plain, open_loop_concurrency(PROFILE.plain, 50.0, 128, 500))
