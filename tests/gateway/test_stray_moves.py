"""Which requests follow their group's switch to the other mode (rules.moves) as a function of plain data."""

from __future__ import annotations

import pytest

from gateway.config import PolicyConfig
from gateway.policies import Completion, Decision, Running
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.adaptive.rules import GROUP_SWITCH, Stray, moves
from gateway.policies.static import ThresholdPolicy
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN
from tests.gateway.test_adaptive_groups import groups, trained
from tests.gateway.test_group_choice import FIELD_E, FIELD_P, LLAMA_E, LLAMA_P, eagle, plain

# Lines in ms a token; prefill in ms a token too.
CHEAP = 0.05


def test_strays_with_output_to_come_follow_a_switch_to_plain() -> None:
    # Two EAGLE requests and the new plain one: at 3 in flight field-8gpu's plain decodes about 2 ms a token faster.
    group = [eagle(inflight=2), plain(inflight=1)]
    strays = [Stray("near-done", "eagle-g0", 4.0, 300.0), Stray("long", "eagle-g0", 200.0, 300.0)]
    assert moves(group, False, strays, CHEAP, 3.0) == ["long"]
    # A dearer prefill than the remaining output saves keeps it where it is.
    assert moves(group, False, strays, 5.0, 3.0) == []


def test_strays_follow_a_switch_to_speculation_where_it_is_faster() -> None:
    group = [eagle(inflight=1, line=LLAMA_E), plain(inflight=2, line=LLAMA_P)]
    strays = [Stray("a", "plain-g0", 100.0, 200.0), Stray("b", "plain-g0", 300.0, 200.0)]
    assert moves(group, True, strays, CHEAP, 3.0) == ["b", "a"]  # the most output to come first


def test_nothing_moves_to_a_mode_no_faster_at_the_load_the_switch_was_priced_at() -> None:
    # At one request in flight field-8gpu's EAGLE is the faster: a stray does not move to plain.
    group = [eagle(inflight=1, line=FIELD_E), plain(inflight=0, line=FIELD_P)]
    stray = [Stray("x", "eagle-g0", 500.0, 10.0)]
    assert moves(group, False, stray, CHEAP, 1.0) == []
    # A switch priced at a forecast of 3 over the next life, where plain is faster, takes it along.
    assert moves(group, False, stray, CHEAP, 3.0) == ["x"]


def test_a_capped_mode_server_takes_no_more() -> None:
    group = [eagle(inflight=2, line=LLAMA_E, cap=3), plain(inflight=3, line=LLAMA_P)]
    strays = [Stray(k, "plain-g0", 300.0, 10.0) for k in ("a", "b", "c")]
    assert len(moves(group, True, strays, CHEAP, 5.0)) == 1


def test_only_a_group_switch_may_move_and_the_config_can_turn_it_off() -> None:
    switch = Decision("plain-g0", GROUP_SWITCH)
    policy = AdaptivePolicy.from_config(PolicyConfig())
    assert policy.move_running and policy.may_move(switch)
    assert not policy.may_move(Decision("plain-g0", "adaptive_group_stay"))
    off = AdaptivePolicy.from_config(PolicyConfig(adaptive_move_running=False))
    assert not off.move_running and not off.may_move(switch) and off.describe()["move_running"] is False
    assert not ThresholdPolicy(1).move_running and not ThresholdPolicy(1).may_move(switch)


def test_a_stream_moved_before_prices_the_output_it_was_given_into_its_re_prefill() -> None:
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN, points=4000)
    # A long prompt's first token teaches plain's prefill: 0.1 ms a token.
    policy.observe(Completion("g0-plain", 129, 0.1, 0.8, 1.0, 1.0, prompt_tokens=1000))
    switch = groups((2, 1))  # two EAGLE strays beside the request that just turned the group plain
    decision = Decision("g0-plain", GROUP_SWITCH)
    fresh = Running("fresh", "g0-eagle", 10, 300, 100.0)
    # The same stream after an earlier move: 5,000 tokens of output are in the prompt it continued.
    moved_before = Running("moved", "g0-eagle", 10, 300, 100.0, given=5000)
    assert policy.moves(switch, decision, [fresh]) == ["fresh"]
    assert policy.moves(switch, decision, [moved_before]) == []


def test_a_moved_answer_teaches_what_its_last_backend_did_and_the_whole_answers_output() -> None:
    """64 of 129 tokens decoded on EAGLE after a move, in 16 chunks at 4 ms a token: EAGLE's tau is 4 and its
    line 4 ms at one request; the mean output is the answer's 129 tokens; the prompt, prefilled where
    the answer started and re-prefilled with the output given, teaches no prefill cost or hit share."""
    policy = AdaptivePolicy()
    idle = groups((0, 0))
    policy.routed(idle, Decision("g0-eagle", "adaptive_prior"))
    before = policy.beliefs()
    for _ in range(200):
        policy.observe(Completion("g0-eagle", 129, 0.5, 63 * 0.004, 1.0, 1.0, token_chunks=16, given=65))
    beliefs = policy.beliefs()
    eagle_arm = beliefs["backends"]["g0-eagle"]
    assert eagle_arm["tau"] == pytest.approx(4.0)
    assert eagle_arm["points"][0] == pytest.approx([1.0, 0.004])
    assert beliefs["mean_output_tokens"] == pytest.approx(129.0, rel=0.01)
    assert beliefs["prefill_seconds_per_token"] == before["prefill_seconds_per_token"] == {}
    assert beliefs["prefix_hit_share"] == before["prefix_hit_share"]
