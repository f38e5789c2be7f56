"""Workload plans: seeded, the same for every target, and shaped as each dataset promises."""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections import Counter

import pytest

from loadtest.prompts import PromptFactory
from loadtest.records import Exchange
from loadtest.workloads.arrivals import arrivals
from loadtest.workloads.lengths import LengthDist
from loadtest.workloads.level import Level, RequestsPerLevel
from loadtest.workloads.multi_turn import MultiTurn
from loadtest.workloads.plan import Session, Turn
from loadtest.workloads.random_prompts import RandomPrompts
from loadtest.workloads.shared_prefix import SharedPrefix
from loadtest.workloads.text import Words, render, token_count
from loadtest.workloads.tiers import TierMix
from loadtest.workloads.workload import Workload
from tokencount import count_tokens

CLOSED = Level(concurrency=4)
OPEN = Level(request_rate=8.0)


def test_words_are_named_by_their_key_and_fewer_words_are_a_prefix() -> None:
    long, short = Words("tenant0", 700).text(), Words("tenant0", 300).text()
    assert long.startswith(short + " ") and count_tokens(long) == 700 and count_tokens(short) == 300
    assert Words("tenant1", 300).text() != short
    assert render(("a literal", Words("x", 0), Words("y", 5))) == "a literal " + Words("y", 5).text()
    assert token_count(("a literal", Words("y", 5))) == count_tokens("a literal") + 5


def test_random_dataset_gives_the_prompts_a_seed_always_gave() -> None:
    # The same seeds as committed results: PromptFactory seeded by seed * 1_000_003 + the level's index.
    workload = Workload(input_len=128, output_len=64, requests_per_level=RequestsPerLevel(20), seed=7,
                        lengths=LengthDist.of(None, 0.5))
    plan = workload.plan(OPEN, 2)
    specs = [(spec.prompt, spec.output_len) for spec in (s.request(0, []) for s in plan.sessions)]
    expected = list(PromptFactory(128, 64, 0.5, seed=7 * 1_000_003 + 2).take(20))
    assert specs == [(e.prompt, e.output_len) for e in expected]
    # The bytes PromptFactory gave for this seed before the workloads existed.
    digest = hashlib.sha256(repr([(e.prompt, e.input_len, e.output_len) for e in expected]).encode()).hexdigest()
    assert digest[:16] == "59dba6314ba84967"
    # Arrival times from random.Random(seed), as the sweep always drew them.
    assert plan.offered_request_s == 8.0
    assert [s.start_s for s in plan.sessions] == arrivals(8.0, 20, random.Random(7))


@pytest.mark.parametrize("dataset", [RandomPrompts(), SharedPrefix(3, 4, 64, 8, 16), MultiTurn(3, 2.0, 2, 64)],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("level", [CLOSED, OPEN], ids=["closed", "open"])
def test_a_plan_depends_only_on_the_workload_the_level_and_its_index(dataset: object, level: Level) -> None:
    workload = Workload(dataset=dataset, input_len=16, output_len=8, requests_per_level=RequestsPerLevel(12), seed=5,  # type: ignore[arg-type]
                        lengths=LengthDist("lognormal"), burstiness=0.5, tier_mix=TierMix.parse("priority=0.5"))
    first, again = workload.plan(level, 1), workload.plan(level, 1)
    assert first == again  # every target gets this very plan
    assert [s.request(0, []) for s in first.sessions] == [s.request(0, []) for s in again.sessions]
    other = workload.plan(level, 2)
    assert render(other.sessions[0].turns[0].user) != render(first.sessions[0].turns[0].user)  # no level reuses a prompt
    assert (first.concurrency, first.offered_request_s) == ((4, None) if level is CLOSED else (None, 8.0))


def test_shared_prefix_groups_share_their_system_prompt_and_every_request_is_sent() -> None:
    dataset = SharedPrefix(num_groups=3, prompts_per_group=5, system_prompt_len=200, question_len=20, output_len=30)
    plan = Workload(dataset=dataset).plan(CLOSED, 0)
    assert plan.requests == 15 and plan.concurrency == 4
    systems = Counter(render(s.system) for s in plan.sessions)
    assert sorted(systems.values()) == [5, 5, 5]
    assert all(count_tokens(text) == 200 for text in systems)
    assert len({render(s.turns[0].user) for s in plan.sessions}) == 15  # every question its own
    spec = plan.sessions[0].request(0, [])
    assert spec.chat_messages()[0] == {"role": "system", "content": spec.system}
    assert spec.completion_prompt() == f"{spec.system}\n\n{spec.prompt}"  # bench_serving's prompt on completions
    assert spec.input_len == 220 and spec.output_len == 30
    groups_in_order = [render(s.system) for s in plan.sessions]
    assert groups_in_order != sorted(groups_in_order, key=list(systems).index)  # shuffled, as bench_serving does


def test_shared_prefix_defaults_are_bench_servings() -> None:
    d = SharedPrefix()
    assert (d.num_groups, d.prompts_per_group, d.system_prompt_len, d.question_len, d.output_len) == (64, 16, 2048, 128, 256)
    plan = Workload(dataset=SharedPrefix(num_groups=1, prompts_per_group=2, system_prompt_len=0)).plan(CLOSED, 0)
    assert plan.sessions[0].system == ()
    assert plan.sessions[0].request(0, []).chat_messages()[0]["role"] == "user"


def test_multi_turn_conversations_spread_over_tenants_with_think_times() -> None:
    dataset = MultiTurn(turns=3, think_time_s=2.0, tenants=2, system_prompt_len=100)
    plan = Workload(dataset=dataset, input_len=10, output_len=5, requests_per_level=RequestsPerLevel(600)).plan(OPEN, 0)
    assert len(plan.sessions) == 200 and plan.requests == 600
    tenants = Counter(render(s.system) for s in plan.sessions)
    assert len(tenants) == 2 and min(tenants.values()) > 70
    assert all(s.turns[0].think_s == 0.0 for s in plan.sessions)
    thinks = [t.think_s for s in plan.sessions for t in s.turns[1:]]
    assert statistics.mean(thinks) == pytest.approx(2.0, rel=0.15) and min(thinks) > 0
    # Conversations start at rate / turns, so the level offers the rate in requests.
    starts = [s.start_s for s in plan.sessions]
    assert len(starts) / starts[-1] == pytest.approx(8.0 / 3, rel=0.2)


def test_multi_turn_closed_loop_has_a_conversation_for_every_slot() -> None:
    plan = Workload(dataset=MultiTurn(turns=4), requests_per_level=RequestsPerLevel(2)).plan(Level(concurrency=6), 0)
    assert len(plan.sessions) == 6 and plan.requests == 24


def test_a_turn_re_sends_the_system_prompt_earlier_turns_and_their_answers() -> None:
    session = Session((Turn(("first question",), 4), Turn(("second",), 6, think_s=1.5)), system=("be brief",), tier="flex")
    spec = session.request(1, [" the answer"])
    assert spec.history == (Exchange("first question", " the answer"),)
    assert spec.chat_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": " the answer"},
        {"role": "user", "content": "second"},
    ]
    assert spec.completion_prompt() == "be brief\n\nfirst question\n\n the answer\n\nsecond"
    tokens = count_tokens("be brief first question the answer second")
    assert (spec.input_len, spec.output_len, spec.tier) == (tokens, 6, "flex")
    with pytest.raises(ValueError):
        session.request(1, [])


def test_a_tier_mix_sends_each_tier_on_its_share_of_sessions() -> None:
    mix = TierMix.parse("priority=0.1, default=0.6,flex=0.2")
    rng = random.Random(1)
    counts = Counter(mix.draw(rng) for _ in range(20000))
    for tier, share in (("priority", 0.1), ("default", 0.6), ("flex", 0.2), (None, 0.1)):
        assert counts[tier] / 20000 == pytest.approx(share, abs=0.01)
    plan = Workload(tier_mix=mix, requests_per_level=RequestsPerLevel(50)).plan(CLOSED, 0)
    assert {s.tier for s in plan.sessions} == {"priority", "default", "flex", None}
    assert plan.sessions[0].request(0, []).tier == plan.sessions[0].tier


@pytest.mark.parametrize("text", ["priority=0.5,priority=0.1", "gold=0.5", "flex=2", "flex=0.6,default=0.6", "flex", "flex=x", ""])
def test_a_bad_tier_mix_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        TierMix.parse(text)


def test_an_infinite_rate_starts_every_session_at_once() -> None:
    plan = Workload(requests_per_level=RequestsPerLevel(5)).plan(Level(request_rate=math.inf), 0)
    assert [s.start_s for s in plan.sessions] == [0.0] * 5
