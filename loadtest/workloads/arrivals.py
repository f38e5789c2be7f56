"""When an open-loop level's sessions start: Poisson or burstier (gamma) arrivals at a rate, or a rate step.

Gaps follow vLLM's `--burstiness` B: gamma with shape B and scale 1 / (rate * B), so the mean gap
is 1 / rate whatever B is and the gaps' coefficient of variation is 1 / sqrt(B). B = 1 is Poisson
(exponential gaps); B < 1 clusters arrivals into bursts, B > 1 spaces them more evenly. A rate
step (`level.RateStep`) is three such phases one after another: low, high, low.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

from loadtest.workloads.level import Draw, RateStep
from loadtest.workloads.plan import Plan, Session


def arrivals(rate: float, count: int, rng: random.Random, burstiness: float = 1.0, start: float = 0.0) -> list[float]:
    """Arrival offsets in seconds of `count` requests at `rate` per second.

    An infinite rate sends them all at `start` (bench_serving's default). Offsets begin at
    `start` + the first gap, so stepped-rate schedules can be built by concatenation.
    """
    if rate <= 0 or math.isnan(rate):
        raise ValueError(f"request rate must be positive, got {rate}")
    if burstiness <= 0 or math.isnan(burstiness):
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate):
        return [start] * count
    offsets: list[float] = []
    t = start
    for _ in range(count):
        # B = 1 keeps the exponential draws the sweep always made, so a seed's schedule is unchanged.
        t += rng.expovariate(rate) if burstiness == 1.0 else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        offsets.append(t)
    return offsets


def stepped_arrivals(step: RateStep, count: int, rng: random.Random, burstiness: float = 1.0) -> list[float]:
    """Start offsets of `count` sessions under a rate step: each phase gets its share of them (in proportion
    to its rate, largest remainders first), arriving at that share's rate from the phase's start."""
    shares = [count * rate / sum(step.phases) for rate in step.phases]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: counts[i] - shares[i])[: count - sum(counts)]:
        counts[i] += 1
    offsets: list[float] = []
    for phase, n in enumerate(counts):
        if n:
            offsets += arrivals(n / step.seconds, n, rng, burstiness, start=phase * step.seconds)
    return offsets


def schedule(sessions: Sequence[Session], draw: Draw) -> Plan:
    """The level's plan for these sessions: C at a time (closed loop), or started at the level's rate.

    An open level offers `request_rate` requests per second: sessions of T turns start at 1/T of
    it, so a multi-turn level and a one-turn level at the same rate offer the same load.
    """
    level = draw.level
    if level.concurrency is not None:
        return Plan(tuple(sessions), concurrency=level.concurrency)
    if level.rate_step is not None:
        step = level.rate_step
        starts = stepped_arrivals(step, len(sessions), random.Random(draw.seed), draw.burstiness)
        timed = tuple(replace(s, start_s=t) for s, t in zip(sessions, starts, strict=True))
        return Plan(timed, offered_request_s=sum(len(s.turns) for s in sessions) / (len(step.phases) * step.seconds))
    if level.request_rate is None:
        raise ValueError(f"{level.label} is neither a concurrency nor a request rate")
    requests = sum(len(s.turns) for s in sessions)
    # One generator per run, not per level: a seed's arrival times are those it always gave.
    starts = arrivals(level.request_rate * len(sessions) / max(requests, 1), len(sessions), random.Random(draw.seed),
                      draw.burstiness)
    timed = tuple(replace(s, start_s=t) for s, t in zip(sessions, starts, strict=True))
    return Plan(timed, offered_request_s=level.request_rate)
