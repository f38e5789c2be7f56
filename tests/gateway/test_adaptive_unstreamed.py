"""What the adaptive policy learns where responses carry no chunk times: a response not streamed (its
usage and life, never a pace or a time to first token it did not see) and the engines' own prefill
counters (`/v1/loads`), which price a prompt's prefix however the client asked for the answer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.policies import Completion, Decision, Prompt
from gateway.policies.adaptive.prefill import RATE
from gateway.pool.snapshot import PoolSnapshot
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN
from tests.gateway.test_adaptive_groups import groups, trained


def reporting(snapshot: PoolSnapshot, **counters: tuple[int, int]) -> PoolSnapshot:
    """`snapshot` with backends' engines reporting (uncached tokens prefilled, busy microseconds) so far."""
    views = tuple(replace(v, prefill_tokens=counters[v.name.replace("-", "_")][0], prefill_busy_us=counters[v.name.replace("-", "_")][1])
                  if v.name.replace("-", "_") in counters else v for v in snapshot.backends)
    return PoolSnapshot(views)


def test_a_response_not_streamed_teaches_its_usage_and_never_a_pace() -> None:
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN)
    observed = policy.beliefs()["backends"]["g0-plain"]["observations"]
    for _ in range(400):  # conversations of four turns, answered whole: a life of 0.9 s, no chunk times
        policy.observe(Completion("g0-plain", 65, 0.9, 0.0, 0.0, 0.0, prompt_tokens=4000, cached_tokens=3000))
    beliefs = policy.beliefs()
    assert beliefs["prefix_hit_share"] == pytest.approx(0.75, abs=0.01)
    assert beliefs["prefix_reuse"] == pytest.approx(3.0, abs=0.2)
    assert beliefs["backends"]["g0-plain"]["observations"] == observed  # no decode window: no point of its curve
    assert beliefs["prefill_seconds_per_token"] == {}  # a 65-token answer's life is not its time to first token
    # A one-token answer's life is: its prompt's prefill (1,000 uncached tokens in 0.1 s).
    policy.observe(Completion("g0-plain", 1, 0.1, 0.0, 0.0, 0.0, prompt_tokens=1000))
    assert policy.beliefs()["prefill_seconds_per_token"] == {"plain": pytest.approx(1e-4)}


def test_the_engines_prefill_counters_price_a_prefix_where_no_stream_taught_a_cost() -> None:
    # The field group of test_adaptive_groups' conversation test: the conversation is cached on the
    # plain server, and at 0.1 ms a token EAGLE's prefill of 1,500 more tokens costs more than its
    # faster decode of 128 saves.
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN)
    idle = groups((0, 0))
    prompt = Prompt(1600.0, {"g0-plain": 1600.0, "g0-eagle": 100.0}, max_tokens=128)
    assert policy.choose(idle, prompt=prompt).backend == "g0-eagle"  # no prefill cost known: the load alone decides
    for tokens in (5_000, 5_100, 10_000, 20_000):  # successive reports; 100 more tokens are too few to read
        busy = 100 * tokens if tokens != 5_100 else 5_000 * 100 + 100 * 900  # 0.1 ms a token, 0.9 over the 100
        policy.routed(reporting(idle, g0_eagle=(tokens, busy), g0_plain=(tokens, busy)), Decision("g0-eagle", "adaptive_prior"))
    beliefs = policy.beliefs()
    assert beliefs["engine_prefill_seconds_per_token"] == {"eagle": pytest.approx(1e-4), "plain": pytest.approx(1e-4)}
    assert beliefs["prefill_seconds_per_token"] == beliefs["engine_prefill_seconds_per_token"]
    assert policy.choose(idle, prompt=prompt) == Decision("g0-plain", "adaptive_prefix_beside")

    # A restarted engine counts from 0 again: its next report is a new start, not a negative reading.
    policy.routed(reporting(idle, g0_eagle=(300, 90_000)), Decision("g0-eagle", "adaptive_prior"))
    assert policy.beliefs()["engine_prefill_seconds_per_token"]["eagle"] == pytest.approx(1e-4)
    policy.routed(reporting(idle, g0_eagle=(10_300, 90_000 + 10_000 * 300)), Decision("g0-eagle", "adaptive_prior"))
    assert policy.beliefs()["engine_prefill_seconds_per_token"]["eagle"] == pytest.approx(1e-4 + RATE * 2e-4)

    # Streamed responses' times to first token, once there, are what a prefill delays (its queueing too).
    for _ in range(5):
        policy.observe(Completion("g0-plain", 65, 0.4, 64 * FIELD_PLAIN.at(1), 1.0, 1.0, prompt_tokens=2000))
    assert policy.beliefs()["prefill_seconds_per_token"] == {"plain": pytest.approx(2e-4)}
