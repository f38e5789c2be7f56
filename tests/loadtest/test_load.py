"""Load shapes, level and target parsing."""

from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest

from loadtest.load import closed_loop, open_loop, poisson_arrivals
from loadtest.prompts import PromptFactory
from loadtest.records import RequestRecord, RequestSpec
from loadtest.sweep import Level, RequestsPerLevel, Target, parse_levels
from tokencount import count_tokens


class FakeServer:
    """Answers after `delay` seconds and tracks how many requests it holds at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.inflight = 0
        self.peak = 0
        self.sent: list[RequestSpec] = []

    async def send(self, spec: RequestSpec) -> RequestRecord:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        self.sent.append(spec)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(self.delay)
        self.inflight -= 1
        return RequestRecord(start=start, expected_output=spec.output_len, end=loop.time(), completion_tokens=spec.output_len)


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(prompt=f"p{i}", input_len=1, output_len=4) for i in range(n)]


async def test_closed_loop_keeps_exactly_c_requests_in_flight_and_sends_each_once() -> None:
    server = FakeServer(0.01)
    done: list[RequestRecord] = []
    run = await closed_loop(server.send, specs(20), concurrency=4, on_done=done.append)
    assert server.peak == 4
    assert len(run.records) == len(done) == 20
    assert sorted(s.prompt for s in server.sent) == sorted(f"p{i}" for i in range(20))
    # 20 requests, 4 at a time, 10 ms each: about 5 rounds, never close to 20 serial ones.
    assert run.duration < 20 * 0.01


async def test_closed_loop_with_fewer_requests_than_workers() -> None:
    server = FakeServer(0.0)
    run = await closed_loop(server.send, specs(3), concurrency=8)
    assert len(run.records) == 3 and server.peak <= 3


async def test_closed_loop_rejects_zero_concurrency() -> None:
    with pytest.raises(ValueError):
        await closed_loop(FakeServer(0).send, specs(1), concurrency=0)


async def test_open_loop_does_not_wait_for_earlier_requests() -> None:
    server = FakeServer(0.2)
    run = await open_loop(server.send, specs(5), arrivals=[0.0, 0.01, 0.02, 0.03, 0.04])
    assert server.peak == 5  # all five overlap: arrivals do not wait for completions
    assert len(run.records) == 5


def test_poisson_arrivals_have_the_requested_mean_rate() -> None:
    arrivals = poisson_arrivals(50.0, 4000, random.Random(1))
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50.0, rel=0.05)
    assert arrivals == sorted(arrivals)


def test_poisson_arrivals_infinite_rate_and_offset_start() -> None:
    assert poisson_arrivals(math.inf, 3, random.Random(0), start=2.0) == [2.0, 2.0, 2.0]
    assert min(poisson_arrivals(10.0, 10, random.Random(0), start=5.0)) > 5.0
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 1, random.Random(0))


def test_requests_per_level_absolute_or_per_slot() -> None:
    assert RequestsPerLevel.parse("64").for_concurrency(8) == 64
    assert RequestsPerLevel.parse("4x").for_concurrency(8) == 32
    for bad in ("0", "x", "-3", "2.5", "abc"):
        with pytest.raises(ValueError):
            RequestsPerLevel.parse(bad)


def test_levels_parse_closed_and_open_loop() -> None:
    assert parse_levels("1,2, 4", None) == (Level(concurrency=1), Level(concurrency=2), Level(concurrency=4))
    assert parse_levels(None, "0.5,inf") == (Level(request_rate=0.5), Level(request_rate=math.inf))
    for bad in ("0", "1,a", ""):
        with pytest.raises(ValueError):
            parse_levels(bad, None)
    with pytest.raises(ValueError):
        parse_levels(None, "-1")


def test_target_parse() -> None:
    assert Target.parse("specgate=http://127.0.0.1:8000/") == Target("specgate", "http://127.0.0.1:8000")
    for bad in ("nourl", "=http://x", "a=ftp://x", "a b=http://x"):
        with pytest.raises(ValueError):
            Target.parse(bad)


def test_prompts_have_the_requested_length_and_differ() -> None:
    factory = PromptFactory(input_len=200, output_len=16, seed=3)
    a, b = factory.next(), factory.next()
    assert count_tokens(a.prompt) == 200 and a.output_len == 16
    assert a.prompt != b.prompt


def test_prompt_lengths_with_a_range_ratio_stay_in_range_and_are_reproducible() -> None:
    lengths = [s.output_len for s in PromptFactory(10, 100, range_ratio=0.5, seed=1).take(200)]
    assert min(lengths) >= 50 and max(lengths) <= 100 and len(set(lengths)) > 10
    assert lengths == [s.output_len for s in PromptFactory(10, 100, range_ratio=0.5, seed=1).take(200)]
