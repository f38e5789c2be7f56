"""The load forecast (gateway/policies/adaptive/forecast.py): mean loads read from the pool's load
integral, the rise of a step up, batches left out of it, and the settled load after a lull."""

from __future__ import annotations

import pytest

from gateway.policies.adaptive.forecast import (
    RISE_AHEAD,
    RISE_WINDOW,
    SETTLED_LIVES,
    LoadForecast,
)


def closed_loop(forecast: LoadForecast, level: int, start: float, seconds: float, step: float = 0.01) -> float:
    """`level` requests always in flight from `start` for `seconds`, one replaced every `step`; the
    integral at the end (an integral that starts at `level * start`)."""
    for k in range(round(seconds / step)):
        t = start + k * step
        forecast.arrived(t, level * t, level - 1, 0)
    return level * (start + seconds)


def test_before_any_request_finished_only_what_is_there_counts() -> None:
    forecast = LoadForecast()
    forecast.arrived(0.0, 0.0, 0, 0)
    assert forecast.load(1.0, 5.0, 5, 2) == 8.0  # five in flight, two waiting and this one
    assert forecast.settled(1.0, 5.0, 5, 2) == 8.0


def test_a_closed_loop_reads_as_its_concurrency_whatever_the_lengths() -> None:
    forecast = LoadForecast()
    forecast.finished(0.5)
    area = closed_loop(forecast, 16, 0.0, 3.0)
    assert forecast.load(3.0, area, 15, 0) == pytest.approx(16.0, rel=0.01)
    assert forecast.settled(3.0, area, 15, 0) == pytest.approx(16.0, rel=0.01)
    # A wrong mean life changes the window, not the reading: the integral counts what was in flight.
    for life in (0.1, 2.0):
        other = LoadForecast()
        other.finished(life)
        closed_loop(other, 16, 0.0, 3.0)
        assert other.load(3.0, area, 15, 0) == pytest.approx(16.0, rel=0.01)


def test_a_step_up_is_seen_within_a_few_arrivals() -> None:
    forecast = LoadForecast()
    forecast.finished(1.0)
    area = closed_loop(forecast, 4, 0.0, 4.0)
    # Open-loop arrivals come faster: six more in flight within 60 ms, one at a time.
    for k in range(6):
        t = 4.0 + 0.01 * (k + 1)
        area += (4 + k) * 0.01
        forecast.arrived(t, area, 4 + k, 0)
    t, inflight = 4.07, 10
    expected = inflight + 1 + (inflight - 4) * RISE_AHEAD / RISE_WINDOW
    assert forecast.load(t, area + 0.1, inflight, 0) == pytest.approx(expected)


def test_a_batch_is_counted_whole_and_not_as_a_rise() -> None:
    forecast = LoadForecast()
    forecast.finished(1.0)
    area = closed_loop(forecast, 4, 0.0, 4.0)
    # Eight requests at one instant: the first sees seven more waiting, the last none.
    for k in range(8):
        forecast.arrived(4.0, area, 4 + k, 7 - k)
    assert forecast.load(4.0, area, 12, 0) == 13.0  # what is there, no rise carried ahead


def test_a_lull_after_heavy_traffic_is_not_light_traffic() -> None:
    forecast = LoadForecast()
    forecast.finished(0.5)
    area = closed_loop(forecast, 32, 0.0, 3.0)
    # Everything finished; a lone request arrives a life later.
    assert forecast.load(3.5, area, 0, 0) < 2.0
    settled = forecast.settled(3.5, area, 0, 0)
    assert settled == pytest.approx(32 * (SETTLED_LIVES * 0.5 - 0.5) / (SETTLED_LIVES * 0.5), rel=0.02)
    # Quiet for the settled span: light at last.
    assert forecast.settled(3.0 + SETTLED_LIVES * 0.5 + 0.1, area, 0, 0) == 1.0
