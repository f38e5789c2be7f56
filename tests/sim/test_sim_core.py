"""The clock-free engine core driven step by step on a made-up clock: the prefix cache in admission and prefill."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from backends.sim.core import DECODE_LOG_INTERVAL, EngineCore, StepPlan
from backends.sim.profiles import RoleProfile
from backends.sim.request import SimRequest
from backends.sim.steps import StepModel
from backends.sim.tokenizer import PseudoText

_rids = itertools.count()
TEXT = PseudoText(0)


def table(**overrides: Any) -> RoleProfile:
    values: dict[str, Any] = {
        "t0_ms": 2.0,
        "per_request_ms": 0.0,
        "max_running_requests": 8,
        "prefill_ms_per_token": 0.5,
        "max_total_tokens": 100000,
    }
    return RoleProfile(**{**values, **overrides})


def core_of(radix_cache: bool = True, max_prefill_tokens: int = 16384, **overrides: Any) -> EngineCore:
    t = table(**overrides)
    return EngineCore(t, StepModel(t, seed=0), TEXT, max_prefill_tokens=max_prefill_tokens, radix_cache=radix_cache)


def request(prompt_ids: list[int], max_new: int = 4) -> SimRequest:
    return SimRequest(
        rid=f"c{next(_rids)}", prompt_ids=prompt_ids, max_new_tokens=max_new, is_streaming=False, text_start=0
    )


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def step(core: EngineCore, now: float) -> tuple[StepPlan | None, float]:
    """One step from `now`: its plan (None when idle) and when it ends."""
    plan = core.plan_step()
    if plan is None:
        return None, now
    end = now + plan.duration_ms / 1000.0
    core.finish_step(plan, now, end)
    return plan, end


def run(core: EngineCore, *reqs: SimRequest, now: float = 0.0) -> tuple[list[StepPlan], float]:
    """Queue `reqs` and step until the core is idle: every plan, and the time it ends."""
    for req in reqs:
        core.enqueue(req)
    plans = []
    while core.has_work():
        plan, now = step(core, now)
        assert plan is not None
        plans.append(plan)
    return plans, now


def test_a_shared_prefix_is_prefilled_once() -> None:
    shared = tokens(0, 1000)
    core = core_of()
    first, _ = run(core, request(shared + tokens(5000, 10)))
    assert first[0].prefill_tokens == 1010 and first[0].duration_ms == pytest.approx(2.0 + 0.5 * 1010)

    second = request(shared + tokens(9000, 50))
    plans, _ = run(core, second)
    assert second.cached_tokens == 1000
    assert plans[0].prefill_tokens == 50 and plans[0].cached_tokens == 1000
    cold, _ = run(core_of(), request(shared + tokens(9000, 50)))
    assert cold[0].duration_ms - plans[0].duration_ms == pytest.approx(0.5 * 1000)  # prefill_ms_per_token * cached


def test_the_same_prompt_again_reuses_all_but_its_last_token() -> None:
    core = core_of()
    prompt = tokens(0, 200)
    run(core, request(prompt))
    again = request(prompt)
    plans, _ = run(core, again)
    assert again.cached_tokens == 199 and plans[0].prefill_tokens == 1


def test_the_next_turn_reuses_the_last_prompt_and_all_but_the_last_output_token() -> None:
    for speculative, lost in ((False, 0), (True, 1)):  # an EAGLE server's bigram keys reuse one token less
        drafting: dict[str, Any] = {"tau": 2.0, "num_draft_tokens": 3} if speculative else {}
        core = core_of(**drafting)
        turn1 = request(tokens(0, 300), max_new=20)
        run(core, turn1)
        output = TEXT.token_ids(turn1.text_start, 0, turn1.produced)
        turn2 = request(turn1.prompt_ids + output + tokens(7000, 40))
        run(core, turn2)
        assert turn2.cached_tokens == 300 + 20 - 1 - lost


def test_colocated_cores_on_one_timeline_keep_their_own_caches() -> None:
    eagle, plain = core_of(tau=2.0, num_draft_tokens=3), core_of()
    prompt = tokens(0, 500)
    _, free_at = run(plain, request(prompt))
    other, again = request(prompt), request(prompt)
    eagle.enqueue(other)
    plain.enqueue(again)
    while eagle.has_work() or plain.has_work():  # one GPU: the two cores' steps take turns on it
        for core in (eagle, plain):
            _, free_at = step(core, free_at)
    assert other.cached_tokens == 0  # the plain server's cache is not the EAGLE server's
    assert again.cached_tokens == 499
    # Each holds what its own requests computed: 500 + 3 tokens, keyed as 502 bigrams on the EAGLE server.
    assert eagle.kv.tree.size == 502 and plain.kv.tree.size == 503


def test_cached_tokens_are_evicted_before_a_request_is_made_to_wait() -> None:
    core = core_of(max_total_tokens=1000)
    old = request(tokens(0, 600), max_new=5)
    run(core, old)
    assert core.evictable_tokens() == 604 and core.kv.free == 396
    big = request(tokens(10_000, 500), max_new=100)  # 600 > 396 free, but fits once the cache is evicted
    core.enqueue(big)
    plan = core.plan_step()
    assert plan is not None and plan.joined == (big,)
    assert core.evictable_tokens() == 0 and core.reserved_tokens() == 600
    # While it runs, what it reserved is not evictable: a request that needs it waits.
    waiter = request(tokens(20_000, 400), max_new=100)
    core.enqueue(waiter)
    core.finish_step(plan, 0.0, 1.0)
    assert core.plan_step() is not None and waiter.state == "waiting"


def test_an_unshared_prompt_is_admitted_exactly_as_without_a_cache() -> None:
    plans = {}
    for radix_cache in (True, False):
        core = core_of(radix_cache=radix_cache, max_total_tokens=500, max_prefill_tokens=300)
        reqs = [request(tokens(i * 1000, 150), max_new=60) for i in range(5)]
        plans[radix_cache], _ = run(core, *reqs)
    assert [(len(p.joined), p.batch, p.duration_ms) for p in plans[True]] == [
        (len(p.joined), p.batch, p.duration_ms) for p in plans[False]
    ]


def test_the_prefill_budget_counts_uncached_tokens() -> None:
    shared = tokens(0, 190)
    cold = core_of(max_prefill_tokens=250)
    plans, _ = run(cold, *(request(shared + tokens(1000 + 10 * i, 10)) for i in range(2)))
    assert [len(p.joined) for p in plans if p.joined] == [1, 1]  # 200 + 200 > 250
    warm = core_of(max_prefill_tokens=250)
    run(warm, request(shared + tokens(500, 10)))
    plans, _ = run(warm, *(request(shared + tokens(1000 + 10 * i, 10)) for i in range(2)))
    assert plans[0].prefill_tokens == 20 and len(plans[0].joined) == 2


def test_disabled_cache_serves_nothing() -> None:
    core = core_of(radix_cache=False)
    prompt = tokens(0, 400)
    run(core, request(prompt))
    again = request(prompt)
    plans, _ = run(core, again)
    assert again.cached_tokens == 0 and plans[0].prefill_tokens == 400 and core.kv.tree.size == 0


def test_cache_hit_rate_is_the_last_prefills_share_until_the_decode_log() -> None:
    core = core_of()
    run(core, request(tokens(0, 100), max_new=1))  # no decode step yet
    core.enqueue(request(tokens(0, 80) + tokens(500, 20), max_new=DECODE_LOG_INTERVAL + 1))
    _, now = step(core, 0.0)
    assert core.cache_hit_rate == pytest.approx(80 / 100)
    for _ in range(DECODE_LOG_INTERVAL - 1):
        _, now = step(core, now)
    assert core.cache_hit_rate == pytest.approx(0.8)
    step(core, now)
    assert core.cache_hit_rate == 0.0  # SGLang's decode log, every 40 decode steps, zeroes it


def test_flush_is_refused_while_requests_run_and_empties_the_cache_after() -> None:
    core = core_of()
    prompt = tokens(0, 100)
    run(core, request(prompt))
    running = request(tokens(5000, 10), max_new=50)
    core.enqueue(running)
    step(core, 0.0)
    assert not core.flush_cache() and core.kv.tree.size > 0
    run(core)
    assert core.flush_cache() and core.kv.tree.size == 0
    again = request(prompt)
    run(core, again)
    assert again.cached_tokens == 0


def test_an_aborted_request_frees_its_kv_and_keeps_what_it_computed() -> None:
    core = core_of()
    prompt = tokens(0, 100)
    req = request(prompt, max_new=50)
    core.enqueue(req)
    _, now = step(core, 0.0)
    _, now = step(core, now)
    assert core.abort(req, now) and req.state == "aborted"
    assert core.reserved_tokens() == 0 and core.kv.tree.size == 101  # the prompt and its first output token
    queued = request(tokens(7000, 10))
    core.enqueue(queued)
    assert core.abort(queued, now) and not core.waiting and core.kv.tree.size == 101
    assert not core.abort(req, now)


def test_waiting_uncached_tokens_count_what_the_cache_would_not_serve() -> None:
    core = core_of(max_running_requests=1)
    run(core, request(tokens(0, 100)))
    core.enqueue(request(tokens(9000, 10), max_new=100))
    step(core, 0.0)
    core.enqueue(request(tokens(0, 60) + tokens(600, 40)))
    core.enqueue(request(tokens(3000, 30)))
    assert core.waiting_uncached_tokens() == 40 + 30


def drafting_core(**overrides: Any) -> EngineCore:
    """An EAGLE-like core (5 ms + 1 ms per request a step, tau 2) whose target steps 2 ms + 0.5 ms per request."""
    t = table(t0_ms=5.0, per_request_ms=1.0, tau=2.0, num_draft_tokens=3, **overrides)
    target = table(t0_ms=2.0, per_request_ms=0.5)
    return EngineCore(t, StepModel(t, seed=0, target=target), TEXT, max_prefill_tokens=16384)


def test_a_drafting_servers_joiners_have_their_first_token_after_their_prefill_and_one_target_step() -> None:
    core = drafting_core()
    decoder = request(tokens(0, 10), max_new=50)
    core.enqueue(decoder)
    _, now = step(core, 0.0)  # its joining step: it decodes from the next one
    joiner, short = request(tokens(1000, 10), max_new=50), request(tokens(2000, 10), max_new=1)
    core.enqueue(joiner)
    core.enqueue(short)
    plan = core.plan_step()
    assert plan is not None and plan.joined == (joiner, short) and plan.decoding == 1
    # Batch 3: the drafting step 5 + 3 ms, the target step 2 + 1.5 ms, and 20 tokens of prefill at 0.5 ms.
    assert plan.duration_ms == pytest.approx(8.0 + 10.0)
    assert plan.first_token_ms == pytest.approx(3.5 + 10.0) and plan.early_first_token
    first = now + plan.first_token_ms / 1000.0
    before = decoder.produced
    assert core.first_tokens(plan, first) == [joiner, short]
    assert joiner.produced == 1 and joiner.first_token_at == first and decoder.produced == before
    # A one-token request is done at its first token: out of the batch, its KV released, before the step ends.
    assert short.done and short.rid not in core.running and core.reserved_tokens() == (10 + 50) * 2
    end = now + plan.duration_ms / 1000.0
    assert core.finish_step(plan, now, end) == [decoder]  # the joiner drafts from the next step on
    assert decoder.produced > before and joiner.produced == 1 and joiner.verify_steps == 0
    assert joiner.last_token_at == first


def test_a_plain_servers_joiners_have_their_first_token_at_the_steps_end() -> None:
    core = core_of()
    core.enqueue(request(tokens(0, 10)))
    plan = core.plan_step()
    assert plan is not None and plan.first_token_ms == plan.duration_ms and not plan.early_first_token
    without_target = drafting_core()
    bare = EngineCore(without_target.table, StepModel(without_target.table, seed=0), TEXT, max_prefill_tokens=16384)
    bare.enqueue(request(tokens(0, 10)))
    plan = bare.plan_step()
    assert plan is not None and not plan.early_first_token  # a drafting table alone: calibration.md's charge


def test_decode_moments_time_each_decode_step_from_the_last_ones_start_as_sglang_does() -> None:
    # Step = 2 ms + 0.25 ms a request. Two requests join in one prefill step, then decode together for
    # 3 steps (one of them is done after 4 tokens) and the other 2 more alone. SGLang times a decode
    # batch from the previous one's launch and skips the first after a prefill: 4 of the 5 decode steps.
    core = core_of(per_request_ms=0.25)
    plans, _ = run(core, request(tokens(0, 8), max_new=4), request(tokens(100, 8), max_new=6))
    assert [p.batch for p in plans if not p.joined] == [2, 2, 2, 1, 1]
    steps, batch, step_us, batch_sq, batch_step, generated = core.decode_moments
    assert (steps, batch, batch_sq, generated) == (4, 6, 10, 6)
    assert step_us == pytest.approx(3 * 2500 + 2250)  # the batch-2 steps, then the first batch-1 one, before each
    assert batch_step == pytest.approx(2 * 2 * 2500 + 2500 + 2250)

    # A co-located server's step between two of this one's is in the cadence: 1 ms here.
    core = core_of(per_request_ms=0.25)
    core.enqueue(request(tokens(0, 8), max_new=8))
    now = 0.0
    for gap in (0.0, 0.0, 0.001, 0.0):
        plan = core.plan_step()
        assert plan is not None
        now += gap
        end = now + plan.duration_ms / 1000.0
        core.finish_step(plan, now, end)
        now = end
    assert core.decode_moments[:3] == pytest.approx([2, 2, 2250 + 3250])
