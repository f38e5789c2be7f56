"""The continuous-batching engine in process: admission, KV reservation, aborts, stops, the timeline."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from backends.sim.core import EngineCore
from backends.sim.engine import Engine
from backends.sim.profiles import RoleProfile
from backends.sim.request import RequestError, SimRequest
from backends.sim.steps import StepModel
from backends.sim.timeline import Timeline
from backends.sim.tokenizer import PseudoText

_ids = itertools.count()


def table(**overrides: Any) -> RoleProfile:
    values: dict[str, Any] = {
        "t0_ms": 2.0,
        "per_request_ms": 0.0,
        "tau": 1.0,
        "num_draft_tokens": 1,
        "max_running_requests": 8,
        "prefill_ms_per_token": 0.0,
        "max_total_tokens": 100000,
    }
    return RoleProfile(**{**values, **overrides})


def request(prompt: int = 10, max_new: int = 5, **extra: Any) -> SimRequest:
    """A request whose prompt shares no token with any other's, so the prefix cache serves nothing."""
    n = next(_ids)
    ids = list(range(n * 1_000_000, n * 1_000_000 + prompt))
    return SimRequest(rid=f"r{n}", prompt_ids=ids, max_new_tokens=max_new, is_streaming=True, text_start=0, **extra)


EngineMaker = Callable[..., Engine]


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineMaker]:
    tasks: list[asyncio.Task[None]] = []

    def make(
        timeline: Timeline | None = None, max_prefill_tokens: int = 16384, target: RoleProfile | None = None, **overrides: Any
    ) -> Engine:
        t = table(**overrides)
        core = EngineCore(t, StepModel(t, seed=0, target=target), PseudoText(0), max_prefill_tokens=max_prefill_tokens)
        engine = Engine(core, timeline or Timeline(), time_scale=1.0)
        tasks.append(asyncio.create_task(engine.run()))
        return engine

    yield make
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def finished(req: SimRequest, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not req.done:
            await req.event.wait()
            req.event.clear()

    await asyncio.wait_for(wait(), timeout)


def test_draws_have_mean_tau_within_range() -> None:
    model = StepModel(table(tau=2.9, num_draft_tokens=4), seed=1)
    draws = model.draw(batch=1, decoding=20000)
    assert draws is not None and set(draws) <= {1, 2, 3, 4}
    assert sum(draws) / len(draws) == pytest.approx(2.9, rel=0.02)
    assert StepModel(table(), seed=1).draw(batch=4, decoding=4) is None


async def test_running_cap_queues_the_rest(make_engine: EngineMaker) -> None:
    engine = make_engine(max_running_requests=2, t0_ms=20.0)
    reqs = [request(max_new=50) for _ in range(3)]
    for r in reqs:
        engine.submit(r)
    await asyncio.sleep(0.05)
    assert [r.state for r in reqs] == ["running", "running", "waiting"]
    assert len(engine.core.waiting) == 1


async def test_kv_reservation_makes_requests_queue_until_freed(make_engine: EngineMaker) -> None:
    engine = make_engine(max_total_tokens=100)
    first, second = request(prompt=10, max_new=50), request(prompt=10, max_new=50)
    engine.submit(first)
    engine.submit(second)
    await asyncio.sleep(0.01)
    assert first.state == "running" and second.state == "waiting" and engine.core.reserved_tokens() == 60
    await finished(first)
    await finished(second)
    assert second.produced == 50 and engine.core.reserved_tokens() == 0


async def test_a_request_that_can_never_fit_is_refused(make_engine: EngineMaker) -> None:
    engine = make_engine(max_total_tokens=100)
    with pytest.raises(RequestError, match="KV cache capacity of 100 tokens"):
        engine.submit(request(prompt=60, max_new=41))
    # An input SGLang's scheduler refuses: at least min(context - 1, KV - 1) - 5 tokens, in its words.
    with pytest.raises(RequestError, match=r"^Input length \(94 tokens\) exceeds the maximum allowed length \(94 tokens\)\. "
                                           r"Use a shorter input or enable --allow-auto-truncate\.$"):
        engine.submit(request(prompt=94, max_new=1))
    assert not engine.live
    engine.submit(request(prompt=93, max_new=1))  # one token less is admitted


async def test_abort_frees_the_slot_and_kv_at_once(make_engine: EngineMaker) -> None:
    engine = make_engine(max_running_requests=1, t0_ms=20.0)
    running, queued = request(max_new=1000), request(max_new=3)
    engine.submit(running)
    engine.submit(queued)
    await asyncio.sleep(0.05)
    assert engine.abort(running)
    assert running.state == "aborted" and running.finish_reason == "abort"
    assert not engine.core.running and engine.core.reserved_tokens() == 0 and engine.core.num_aborted == 1
    assert not engine.abort(running)  # already gone
    await finished(queued)
    assert queued.finish_reason == "length"


async def test_abort_of_a_queued_request(make_engine: EngineMaker) -> None:
    engine = make_engine(max_running_requests=1, t0_ms=20.0)
    engine.submit(request(max_new=1000))
    queued = request()
    engine.submit(queued)
    await asyncio.sleep(0.01)
    assert queued.state == "waiting"
    assert engine.abort(queued) and not engine.core.waiting and queued.state == "aborted"


async def test_prefill_budget_spreads_joins_over_steps(make_engine: EngineMaker) -> None:
    engine = make_engine(max_prefill_tokens=100, t0_ms=30.0)
    reqs = [request(prompt=60, max_new=100) for _ in range(3)]
    for r in reqs:
        engine.submit(r)
    await reqs[0].event.wait()  # end of the first step; the second has just joined the next one
    assert [r.produced for r in reqs] == [1, 0, 0]
    assert [r.state for r in reqs] == ["running", "running", "waiting"]


async def test_stop_string_cuts_the_text(make_engine: EngineMaker) -> None:
    engine = make_engine()
    text = engine.text.text(0, 0, 40)
    stop = text.split(" ")[8]  # a word some way in (index 0 is the empty string before the first space)
    req = request(max_new=40, stop=(" " + stop,))
    engine.submit(req)
    await finished(req)
    assert req.finish_reason == "stop" and req.matched_stop == " " + stop
    assert req.text_limit == text.index(" " + stop)
    assert req.produced < 40


async def test_natural_stop_reports_eos(make_engine: EngineMaker) -> None:
    engine = make_engine()
    req = request(max_new=4, natural_stop=2)
    engine.submit(req)
    await finished(req)
    assert (req.finish_reason, req.matched_stop, req.produced) == ("stop", 2, 4)


async def _sub_millisecond_run(make_engine: EngineMaker) -> float:
    """Seconds 2,000 steps of 0.25 ms take: 0.5 s by the model."""
    engine = make_engine(t0_ms=0.25)  # shorter than the event loop's timer resolution
    req = request(max_new=2000)
    loop = asyncio.get_running_loop()
    start = loop.time()
    engine.submit(req)
    await finished(req)
    return loop.time() - start


async def test_absolute_deadlines_keep_sub_millisecond_steps_on_time(make_engine: EngineMaker) -> None:
    # A step is never early, so the model's 0.5 s is a floor; steps timed from the one before, each
    # rounded up to the loop's ~1 ms timer resolution, would take about four times it (2 s). The
    # margin above is for a busy machine; the exact figure is the simtiming test's.
    elapsed = await _sub_millisecond_run(make_engine)
    assert 0.5 * 0.95 <= elapsed < 0.5 * 2.5


@pytest.mark.simtiming
async def test_sub_millisecond_steps_take_the_models_time(make_engine: EngineMaker) -> None:
    assert await _sub_millisecond_run(make_engine) == pytest.approx(2000 * 0.00025, rel=0.15)


async def test_engines_sharing_a_timeline_take_turns(make_engine: EngineMaker) -> None:
    alone = make_engine(t0_ms=4.0)
    shared = Timeline()
    a, b = make_engine(timeline=shared, t0_ms=4.0), make_engine(timeline=shared, t0_ms=4.0)
    for engine in (alone, a, b):
        engine.submit(request(max_new=90000))
    await asyncio.sleep(0.4)
    assert a.core.num_steps + b.core.num_steps == pytest.approx(alone.core.num_steps, rel=0.2)
    assert a.core.num_steps == pytest.approx(b.core.num_steps, rel=0.2)  # the lock is fair


async def test_a_drafting_servers_joiner_streams_its_first_token_within_its_joining_step(make_engine: EngineMaker) -> None:
    # A 200 ms drafting step whose target steps 2 ms: the first token is woken long before the step ends.
    engine = make_engine(t0_ms=200.0, tau=2.0, num_draft_tokens=3, target=table(t0_ms=2.0))
    req = request(max_new=5)
    engine.submit(req)
    await asyncio.wait_for(req.event.wait(), 5.0)
    assert req.produced == 1 and engine.core.num_steps == 0  # the joining step has not ended
    assert req.first_token_at is not None and engine.timeline.free_at - req.first_token_at == pytest.approx(0.198)
    await finished(req)
    assert req.produced == 5 and req.verify_steps >= 2


async def test_freeze_stalls_and_thaw_resumes(make_engine: EngineMaker) -> None:
    engine = make_engine()
    req = request(max_new=10000)
    engine.submit(req)
    await asyncio.sleep(0.02)
    engine.freeze()
    await asyncio.sleep(0.01)
    produced = req.produced
    probe = asyncio.create_task(engine.next_step())
    await asyncio.sleep(0.05)
    assert req.produced == produced and not probe.done()
    engine.thaw()
    await asyncio.wait_for(probe, 1.0)
    assert req.produced > produced
