"""The prefill that runs between a group's decode steps, as the adaptive policy reads it: a stream's decode
window teaches its server's curve less the prefill of the prompts sent to its group meanwhile (at the engines'
own cost), and each request in flight brings a share of the group's time to prefill, which slows a group
for the choice among groups (tests/gateway/test_group_choice.py) and never decides its mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.policies import Decision
from gateway.policies.adaptive import AdaptivePolicy
from gateway.pool.snapshot import PoolSnapshot
from tests.gateway.test_adaptive import FIELD_EAGLE
from tests.gateway.test_adaptive_groups import completion, groups
from tests.gateway.test_adaptive_unstreamed import reporting

COST = 1e-4  # seconds of prefill per prompt token, as the engines report it below


def knowing_the_prefill_cost(idle: PoolSnapshot) -> AdaptivePolicy:
    """A one-group policy whose engines have reported prefilling at `COST` a token."""
    policy = AdaptivePolicy()
    for tokens in (5_000, 10_000):
        busy = round(tokens * COST * 1e6)
        policy.routed(reporting(idle, g0_eagle=(tokens, busy), g0_plain=(tokens, busy)), Decision("g0-eagle", "adaptive_prior"))
    assert policy.beliefs()["engine_prefill_seconds_per_token"] == {"eagle": pytest.approx(COST), "plain": pytest.approx(COST)}
    return policy


def test_a_curve_is_of_decode_alone_once_the_engines_prefill_cost_is_known() -> None:
    # Open loop: as many requests arrive over a life as are in flight, so the prompts sent to the group
    # while a response decoded grow with its load (4,000 tokens a request in flight), and their prefill
    # (0.4 s a request in flight here) lands between its decode steps.
    idle = groups((0, 0))
    taught = knowing_the_prefill_cost(idle)
    untaught = AdaptivePolicy()
    untaught.routed(idle, Decision("g0-eagle", "adaptive_prior"))
    for i in range(400):
        n = 1 + i % 16
        alone = completion("g0-eagle", FIELD_EAGLE, n)
        sent = 4_000.0 * n
        stalled = replace(alone, decode_seconds=alone.decode_seconds + sent * COST, group_prompt_tokens=sent)
        taught.observe(stalled)
        untaught.observe(stalled)
    at_eight = groups((7, 0))  # one more request makes 8
    assert taught.predicted_tpot(at_eight, "g0-eagle") == pytest.approx(FIELD_EAGLE.at(8), rel=0.03)
    # Counted in, the prefill doubled the curve at 8 and made it rise with the arrival rate.
    assert untaught.predicted_tpot(at_eight, "g0-eagle") == pytest.approx(FIELD_EAGLE.at(8) + 8 * 4_000 * COST / 128, rel=0.03)


def test_each_request_in_flight_brings_the_mean_prompt_it_was_sent_to_prefill_over_a_life() -> None:
    idle = groups((0, 0))
    policy = knowing_the_prefill_cost(idle)
    assert policy.beliefs()["prefilling_per_request"] == 0.0  # no life known yet
    for _ in range(20):
        policy.observe(replace(completion("g0-eagle", FIELD_EAGLE, 1, tokens=65), ttft=0.0, decode_seconds=0.5))
    sent = 0.0
    for k in range(200):  # requests alternately sent 1,000 and 3,000 prompt tokens to prefill (2,000 on average)
        sent += 1_000.0 if k % 2 else 3_000.0
        views = tuple(replace(v, sent_prompt_tokens=sent if v.speculative else 0.0) for v in idle.backends)
        policy.routed(PoolSnapshot(views, float(k)), Decision("g0-eagle", "adaptive_predicted_faster"))
    # 2,000 tokens at 0.1 ms over a life of 0.5 s.
    assert policy.beliefs()["prefilling_per_request"] == pytest.approx(2_000 * COST / 0.5, rel=0.05)
