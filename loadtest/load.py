"""Load shapes: closed loop (C workers back to back) and open loop (requests at given arrival times)."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence

from loadtest.records import LevelRun, RequestRecord, RequestSpec

Sender = Callable[[RequestSpec], Awaitable[RequestRecord]]
OnDone = Callable[[RequestRecord], None]


def _ignore(_: RequestRecord) -> None:
    return None


async def closed_loop(
    send: Sender, specs: Sequence[RequestSpec], concurrency: int, on_done: OnDone = _ignore
) -> LevelRun:
    """Run `specs` with `concurrency` workers; each sends its next request as soon as its last ended."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    pending = iter(specs)
    records: list[RequestRecord] = []

    async def worker() -> None:
        # Workers share one iterator, so whichever finishes first takes the next request.
        for spec in pending:
            record = await send(spec)
            records.append(record)
            on_done(record)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(specs)))))
    return LevelRun(started=started, finished=time.perf_counter(), records=records)


def poisson_arrivals(rate: float, count: int, rng: random.Random, start: float = 0.0) -> list[float]:
    """Arrival offsets in seconds of `count` requests at `rate` per second (exponential gaps).

    An infinite rate sends them all at `start` (bench_serving's default). Offsets begin at
    `start` + the first gap, so stepped-rate schedules can be built by concatenation.
    """
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    if math.isinf(rate):
        return [start] * count
    arrivals: list[float] = []
    t = start
    for _ in range(count):
        t += rng.expovariate(rate)
        arrivals.append(t)
    return arrivals


async def open_loop(
    send: Sender, specs: Sequence[RequestSpec], arrivals: Sequence[float], on_done: OnDone = _ignore
) -> LevelRun:
    """Send each request at its arrival offset (seconds from now), whether or not others finished."""
    if len(arrivals) != len(specs):
        raise ValueError("need one arrival time per request")
    records: list[RequestRecord] = []

    async def one(spec: RequestSpec) -> None:
        record = await send(spec)
        records.append(record)
        on_done(record)

    started = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    for spec, offset in zip(specs, arrivals):
        # Absolute deadlines: a late wake-up does not push every later arrival back.
        delay = started + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(spec)))
    await asyncio.gather(*tasks)
    return LevelRun(started=started, finished=time.perf_counter(), records=records)
