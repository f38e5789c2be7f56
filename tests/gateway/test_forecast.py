"""The load forecast (gateway/policies/adaptive/forecast.py): the mean load arrivals met, the rise of a
step up, bursts left out of it, the settled load after a lull, and light traffic's rate."""

from __future__ import annotations

import itertools
import random

import pytest

from gateway.policies.adaptive.forecast import (
    IDLE_SHARE,
    MET_ARRIVALS,
    RATE_ARRIVALS,
    RISE_AHEAD,
    RISE_WINDOW,
    SETTLED_LIVES,
    LoadForecast,
)

# The gateway's routing decisions (one worker: each arrival is the next).
DECISIONS = itertools.count(1)


def closed_loop(forecast: LoadForecast, level: int, start: float, seconds: float, step: float = 0.01) -> None:
    """`level` requests always in flight from `start` for `seconds`, one replaced every `step`."""
    for k in range(round(seconds / step)):
        forecast.arrived(start + k * step, level - 1, next(DECISIONS))


def poisson(forecast: LoadForecast, rate: float, life: float, arrivals: int, seed: int = 0) -> tuple[float, float]:
    """Open-loop arrivals at `rate` per second, each in flight for `life` seconds, fed to `forecast`; at
    each arrival after the first hundred, the settled load read just before it (nothing counted as there
    now). Returns the mean of those readings and the time-averaged in-flight count."""
    draw = random.Random(seed)
    t, ends, readings = 0.0, [], []
    for k in range(arrivals):
        t += draw.expovariate(rate)
        ends = [e for e in ends if e > t]
        if k >= 100:
            readings.append(forecast.settled(t, 0))
        forecast.arrived(t, len(ends), next(DECISIONS))
        ends.append(t + life)
    return sum(readings) / len(readings), rate * life


def test_before_any_request_finished_only_what_is_there_counts() -> None:
    forecast = LoadForecast()
    forecast.arrived(0.0, 0, next(DECISIONS))
    assert forecast.load(1.0, 5) == 6.0  # five in flight and this one
    assert forecast.settled(1.0, 5) == 6.0


def test_a_closed_loop_reads_as_its_concurrency_whatever_the_lengths() -> None:
    forecast = LoadForecast()
    forecast.finished(0.5)
    closed_loop(forecast, 16, 0.0, 3.0)
    assert forecast.load(3.0, 15) == pytest.approx(16.0)
    assert forecast.settled(3.0, 15) == pytest.approx(16.0)
    # A wrong mean life changes the window, not the reading: every arrival met the same load.
    for life in (0.1, 2.0):
        other = LoadForecast()
        other.finished(life)
        closed_loop(other, 16, 0.0, 3.0)
        assert other.load(3.0, 15) == pytest.approx(16.0)


def test_an_open_loop_arrival_meets_the_mean_load_and_adds_itself() -> None:
    """Poisson arrivals see the time-averaged load; each decodes beside it and adds itself."""
    for rate in (0.25, 0.5, 2.0, 8.0):
        forecast = LoadForecast()
        forecast.finished(2.0)
        read, mean = poisson(forecast, rate, 2.0, 3000)
        # Within 10% of one more than the mean (a window of few arrivals reads a little light: its
        # arrivals met fewer), where the time average alone is a whole request short.
        assert read == pytest.approx(1.0 + mean, rel=0.1)


def test_arrivals_over_a_life_are_met_for_half_of_it() -> None:
    """A request meets those arriving after it from their arrival on: over its life, half as many as
    arrive in one, which an arrival meets in flight (Little); a rise adds what it carries ahead."""
    unknown = LoadForecast()
    unknown.arrived(0.0, 3, next(DECISIONS))
    assert unknown.arriving(0.1, 3) == float("inf")  # no life known yet: no rate to read
    closed = LoadForecast()
    closed.finished(0.5)
    closed_loop(closed, 16, 0.0, 3.0)
    assert closed.arriving(3.0, 15) == pytest.approx(7.5)  # 15 replaced over a life
    for rate in (0.5, 4.0):
        opened = LoadForecast()
        opened.finished(2.0)
        poisson(opened, rate, 2.0, 2000)
        assert opened.arriving(2000 / rate, 0) == pytest.approx(rate * 2.0 / 2.0, rel=0.5, abs=0.3)
    # A step up from a closed loop of 4: six more in flight within 60 ms carry a rise of six ahead.
    closed_loop(closed, 4, 3.0, 4.0)
    for k in range(6):
        closed.arrived(7.0 + 0.01 * (k + 1), 4 + k, next(DECISIONS))
    rising = closed.arriving(7.07, 10) - 6 * RISE_AHEAD / RISE_WINDOW
    assert 1.5 <= rising <= 2.5  # the last life's arrivals met 4 to 10 in flight


def test_a_light_span_reaches_back_to_the_last_arrivals() -> None:
    """At light load a life holds one arrival or none: the forecast reads the last few instead."""
    forecast = LoadForecast()
    forecast.finished(1.0)
    for k in range(MET_ARRIVALS):  # each met one other, five seconds apart
        forecast.arrived(5.0 * k, 1, next(DECISIONS))
    at = 5.0 * MET_ARRIVALS
    assert forecast.load(at, 0) == pytest.approx(2.0)
    assert forecast.settled(at, 0) == pytest.approx(2.0)
    # Nothing within the last `2 * SETTLED_LIVES` lives: only what is there now.
    assert forecast.settled(at + 5.0 + 2 * SETTLED_LIVES, 0) == 1.0


def test_a_step_up_is_seen_within_a_few_arrivals() -> None:
    forecast = LoadForecast()
    forecast.finished(1.0)
    closed_loop(forecast, 4, 0.0, 4.0)
    # Open-loop arrivals come faster: six more in flight within 60 ms, one at a time.
    for k in range(6):
        forecast.arrived(4.0 + 0.01 * (k + 1), 4 + k, next(DECISIONS))
    t, inflight = 4.07, 10
    expected = inflight + 1 + (inflight - 4) * RISE_AHEAD / RISE_WINDOW
    assert forecast.load(t, inflight) == pytest.approx(expected)


def test_a_burst_is_not_a_rise() -> None:
    """A client's burst reaches the gateway one request at a time, a fraction of a millisecond apart: what
    is there counts, and no rise is carried ahead (a closed loop of 16 starting read as up to 44)."""
    forecast = LoadForecast()
    forecast.finished(1.0)
    closed_loop(forecast, 4, 0.0, 4.0)
    for k in range(8):
        forecast.arrived(5.0 + 0.0003 * k, 4 + k, next(DECISIONS))
    assert forecast.load(5.0024, 12) == 13.0
    assert forecast.in_burst(5.0024) and not forecast.in_burst(5.05)  # the next one of it, or not
    # The same eight spread over 60 ms are a step up in open-loop load: their rise is carried ahead.
    stepped = LoadForecast()
    stepped.finished(1.0)
    closed_loop(stepped, 4, 0.0, 4.0)
    for k in range(8):
        stepped.arrived(5.0 + 0.0075 * k, 4 + k, next(DECISIONS))
    assert stepped.load(5.06, 12) > 13.0 + 4
    assert not stepped.in_burst(5.06)


def test_a_closed_loop_replacing_completions_in_waves_reads_its_concurrency() -> None:
    """A step ends several requests at once and the clients send their next ones over the next
    millisecond: each wave refills the loop, which is no rise."""
    forecast = LoadForecast()
    forecast.finished(0.5)
    t = 0.0
    for _ in range(40):
        for k in range(4):  # four end together; their successors arrive 0.3 ms apart
            forecast.arrived(t + 0.0003 * k, 12 + k, next(DECISIONS))
        t += 0.05
    assert forecast.load(t, 15) == pytest.approx(16.0, abs=0.5)


def test_a_lull_after_heavy_traffic_is_not_light_traffic() -> None:
    forecast = LoadForecast()
    forecast.finished(0.5)
    closed_loop(forecast, 32, 0.0, 3.0)
    # Everything finished; a lone request arrives a life and a half later: the last life held no
    # arrival, and the arrivals before it met 32.
    assert forecast.settled(3.75, 0) == pytest.approx(32.0)
    # Lone requests after the lull: each meets only itself, and the settled load falls with them.
    for k in range(MET_ARRIVALS):
        forecast.arrived(5.0 + 0.5 * k, 0, next(DECISIONS))
    assert forecast.load(5.0 + 0.5 * MET_ARRIVALS, 0) == 1.0
    # Quiet for twice the settled span: light at last, whatever came before.
    assert forecast.settled(5.0 + 0.5 * MET_ARRIVALS + 2 * SETTLED_LIVES * 0.5, 0) == 1.0


def test_an_arrival_at_an_idle_node_under_light_traffic_expects_only_those_joining_it() -> None:
    """Light Poisson traffic: an idle arrival is joined over its life by half the arrivals of a life, as
    many as the last arrivals found in flight (Little). A pair that overlapped among the last few lifts
    the mean load of the last lives' arrivals by half, that by a sixteenth."""
    for rate in (0.25, 0.5):
        forecast = LoadForecast()
        forecast.finished(0.75)
        draw = random.Random(1)
        t, ends, readings = 0.0, [], []
        for _ in range(2000):
            t += draw.expovariate(rate)
            ends = [e for e in ends if e > t]
            if not ends and (joining := forecast.joining()) is not None:
                readings.append(joining)
            forecast.arrived(t, len(ends), next(DECISIONS))
            ends.append(t + 0.75)
        assert len(readings) > 1000  # most arrivals find the node idle, and light
        assert sum(readings) / len(readings) == pytest.approx(rate * 0.75 / 2.0, rel=0.15)
    forecast = LoadForecast()
    forecast.finished(0.75)
    for k in range(MET_ARRIVALS - 2):  # lone arrivals two seconds apart, then a pair
        forecast.arrived(2.0 * k, 0, next(DECISIONS))
    forecast.arrived(2.0 * MET_ARRIVALS, 0, next(DECISIONS))
    forecast.arrived(2.0 * MET_ARRIVALS + 0.1, 1, next(DECISIONS))
    at = 2.0 * MET_ARRIVALS + 2.0
    assert forecast.load(at, 0) >= 1.5  # the few arrivals of the last lives: half of them met two
    assert forecast.joining() == pytest.approx(1 / MET_ARRIVALS / 2.0)  # the last eight found one in flight in all


def test_an_idle_moment_amid_heavier_traffic_says_nothing_of_what_joins() -> None:
    """Where fewer than `IDLE_SHARE` of the last arrivals found the node idle, its idle moment is a lull, a
    closed loop refilling or a burst's gap: no reading."""
    forecast = LoadForecast()
    forecast.finished(0.5)
    closed_loop(forecast, 32, 0.0, 3.0)
    assert forecast.joining() is None  # every arrival met 31 others
    assert LoadForecast().joining() is None  # nothing known
    busy = round(MET_ARRIVALS * (1.0 - IDLE_SHARE)) + 1
    for k in range(MET_ARRIVALS):  # light, but more than half of the last arrivals found company
        forecast.arrived(10.0 + k, 1 if k < busy else 0, next(DECISIONS))
    assert forecast.joining() is None
    forecast.arrived(10.0 + MET_ARRIVALS, 0, next(DECISIONS))
    assert forecast.joining() is not None


def test_light_traffic_s_rate_is_the_gateway_s_over_its_last_arrivals_whichever_worker_reads_it() -> None:
    """Arrivals a second apart, each finding the node idle (light traffic): one worker reads a second's
    rate; so does each of two that route every other one, from the gateway's count of routings."""
    alone, first, second = LoadForecast(), LoadForecast(), LoadForecast()
    for forecast in (alone, first, second):
        forecast.finished(0.5)
    for k in range(64):
        alone.arrived(float(k), 0, k)
        (first if k % 2 else second).arrived(float(k), 0, k)
    for forecast in (alone, first, second):
        assert forecast.light_rate() == pytest.approx(1.0)
    # A closed loop is not light traffic: no rate.
    closed = LoadForecast()
    closed.finished(0.5)
    closed_loop(closed, 16, 0.0, 3.0)
    assert closed.light_rate() is None


def test_light_traffic_s_rate_reaches_back_past_the_arrivals_that_found_it_light() -> None:
    """Poisson arrivals at one a second: the last 8 arrivals found the node idle most often where they
    came slowly, so the rate is read over the last RATE_ARRIVALS, within a fifth of the truth."""
    draw = random.Random(3)
    forecast = LoadForecast()
    forecast.finished(0.3)
    t, ends, readings = 0.0, [], []
    for k in range(4000):
        t += draw.expovariate(1.0)
        ends = [e for e in ends if e > t]
        forecast.arrived(t, len(ends), k)
        ends.append(t + 0.3)
        if k > RATE_ARRIVALS and (rate := forecast.light_rate()) is not None:
            readings.append(rate)
    assert len(readings) > 2000
    assert sum(readings) / len(readings) == pytest.approx(1.0, rel=0.2)
