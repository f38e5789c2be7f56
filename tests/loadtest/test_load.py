"""Load shapes, level and target parsing."""

from __future__ import annotations

import asyncio
import math

import pytest

from loadtest.load import SKIPPED, closed_loop, open_loop, run_plan
from loadtest.prompts import PromptFactory
from loadtest.records import Exchange, RequestRecord, RequestSpec
from loadtest.sweep import Level, RequestsPerLevel, Target, parse_levels, parse_trace_levels
from loadtest.workloads.plan import Plan, Session, Turn
from tokencount import count_tokens


class FakeServer:
    """Answers after `delay` seconds (`answer N` to the N-th request; the prompts in `fail` get a 500)
    and tracks how many requests it holds at once."""

    def __init__(self, delay: float, fail: tuple[str, ...] = ()) -> None:
        self.delay = delay
        self.fail = fail
        self.inflight = 0
        self.peak = 0
        self.sent: list[RequestSpec] = []

    async def send(self, spec: RequestSpec) -> RequestRecord:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        self.sent.append(spec)
        answer = f"answer {len(self.sent)}"
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(self.delay)
        self.inflight -= 1
        if spec.prompt in self.fail:
            return RequestRecord(start=start, expected_output=spec.output_len, end=loop.time(), status=500, error_kind="http_500")
        return RequestRecord(start=start, expected_output=spec.output_len, end=loop.time(), completion_tokens=spec.output_len,
                             streamed=False, body_text=answer, tier=spec.tier)


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


def conversation(name: str, turns: int, start_s: float = 0.0, think_s: float = 0.0) -> Session:
    return Session(
        tuple(Turn((f"{name}.{k}",), 4, think_s=think_s if k else 0.0) for k in range(turns)),
        start_s=start_s, system=(f"system {name}",), tier="priority",
    )


async def test_a_plan_runs_c_conversations_at_a_time_each_turn_re_sending_the_real_answers() -> None:
    server = FakeServer(0.005)
    run = await run_plan(server.send, Plan(tuple(conversation(n, 3) for n in "abcde"), concurrency=2))
    assert server.peak == 2 and len(run.records) == 15 and all(r.ok for r in run.records)
    answers = {s.prompt: f"answer {i + 1}" for i, s in enumerate(server.sent)}  # what the server said to each
    for name in "abcde":
        turns = [s for s in server.sent if s.prompt.startswith(name + ".")]
        assert [t.prompt for t in turns] == [f"{name}.0", f"{name}.1", f"{name}.2"]  # in order, one at a time
        assert turns[2].history == (Exchange(f"{name}.0", answers[f"{name}.0"]), Exchange(f"{name}.1", answers[f"{name}.1"]))
        assert {t.system for t in turns} == {f"system {name}"} and {t.tier for t in turns} == {"priority"}


async def test_a_failed_turn_ends_its_conversation_and_its_later_turns_count_as_skipped() -> None:
    server = FakeServer(0.0, fail=("a.1",))
    done: list[RequestRecord] = []
    run = await run_plan(server.send, Plan((conversation("a", 4), conversation("b", 2)), concurrency=2), done.append)
    assert [s.prompt for s in server.sent if s.prompt.startswith("a")] == ["a.0", "a.1"]
    assert len(run.records) == len(done) == 6
    assert sorted(r.error_kind or "ok" for r in run.records) == ["http_500", "ok", "ok", "ok", SKIPPED, SKIPPED]


async def test_think_times_and_session_starts_are_stretched_by_the_time_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr("loadtest.load.asyncio.sleep", sleep)
    server = FakeServer(0.0)
    plan = Plan((conversation("a", 3, start_s=0.0, think_s=2.0), conversation("b", 1, start_s=10.0)))
    run = await run_plan(server.send, plan, time_scale=0.5)
    assert len(run.records) == 4 and all(r.ok for r in run.records)
    # Two think times of 2 s and b's start at 10 s, each halved; the open loop sleeps until b's start.
    assert sorted(d for d in slept if d > 0.5) == pytest.approx([1.0, 1.0, 5.0], abs=0.05)


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


def test_trace_levels_parse_time_scales() -> None:
    assert parse_trace_levels("1, 0.5") == (Level(trace_time_scale=1.0), Level(trace_time_scale=0.5))
    assert Level(trace_time_scale=0.25).label == "trace x0.25"
    assert [Level(request_rate=r).label for r in (2.5, math.inf, None)] == ["2.5/s", "inf/s", "inf/s"]
    for bad in ("0", "-1", "inf", "a", ""):
        with pytest.raises(ValueError):
            parse_trace_levels(bad)


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
