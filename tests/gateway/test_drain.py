"""Rule 9: a co-located group whose requests stopped coming moves its long plain answers to EAGLE (rules.drain,
AdaptivePolicy.drain_mark / drain_moves), and they come back with the group's next request."""

from __future__ import annotations

from dataclasses import replace

from gateway.config import PolicyConfig
from gateway.policies import Decision, DrainMark, Running
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.adaptive.rules import DRAIN_QUIET, Stray, drain
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN
from tests.gateway.test_adaptive_groups import completion, groups, trained
from tests.gateway.test_adaptive_unstreamed import reporting
from tests.gateway.test_group_choice import LLAMA_E, LLAMA_P, eagle, plain

CHEAP = 0.05  # ms a token of prefill, as the lines are in ms
GAP = 0.1  # seconds between the arrivals that set the group's mode


def test_a_groups_plain_streams_go_to_eagle_all_or_none() -> None:
    # llama8b-h100's pair, two plain streams: EAGLE decodes them about 2.5 ms a token faster.
    group = [eagle(inflight=0, line=LLAMA_E), plain(inflight=2, line=LLAMA_P)]
    long, short = Stray("long", "plain-g0", 600.0, 300.0), Stray("short", "plain-g0", 100.0, 300.0)
    assert drain(group, [long, short], CHEAP, 200.0, 0.0) == ["long", "short"]
    # Their decode saved does not pay for what their re-prefill stalls: both stay.
    assert drain(group, [long, short], 2.0, 200.0, 0.0) == []
    # Priced together: an answer all but done, whose own few tokens would never pay for its re-prefill,
    # goes along with the long one, so the group never runs both modes.
    nearly_done = Stray("nearly", "plain-g0", 5.0, 300.0)
    assert drain(group, [long, nearly_done], CHEAP, 200.0, 0.0) == ["long", "nearly"]
    assert drain(group, [long, nearly_done], 2.0, 200.0, 0.0) == []
    # No long tail to come: nothing moves.
    assert drain(group, [short], CHEAP, 200.0, 0.0) == []
    # EAGLE's KV room cannot hold them: nothing moves.
    assert drain(group, [long, short], CHEAP, 200.0, 1200.0) == []
    assert drain(group, [long, short], CHEAP, 200.0, 1300.0) == ["long", "short"]  # 300 + 600 and 300 + 100 tokens


def quiet_plain_group(engine_prefill: float = 0.0) -> tuple[AdaptivePolicy, float]:
    """field-8gpu's pair, fitted, its last arrivals sent to plain `GAP` apart (with `engine_prefill`, the
    EAGLE engine reporting that many seconds a prompt token of prefill meanwhile); the policy and the last
    arrival's time."""
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN, points=4000)
    at = 0.0
    for i in range(12):
        at += GAP
        snapshot = replace(groups((0, 1)), at=at)
        if engine_prefill:
            tokens = 1000 * (i + 1)
            snapshot = replace(reporting(snapshot, g0_eagle=(tokens, round(tokens * engine_prefill * 1e6))), at=at)
        policy.choose(snapshot)  # as admission asks before it routes
        policy.routed(snapshot, Decision("g0-plain", "adaptive_group_stay"))
    return policy, at


def running(remaining: int, backend: str = "g0-plain") -> Running:
    return Running("long", backend, 10, 10 + remaining, 100.0)


def test_a_quiet_plain_group_moves_its_long_answer_to_eagle_and_takes_it_back_with_the_next_request() -> None:
    policy, last = quiet_plain_group()
    mark = policy.drain_mark(last + 0.01)
    assert mark is not None and mark.after > 0.0
    later = last + 0.01 + DRAIN_QUIET * GAP
    assert policy.drain_moves(replace(groups((0, 1)), at=later), mark, [running(2000)]) == [("long", "g0-eagle")]
    # The group's next request goes to plain (its mode): the drained answer comes back with it.
    back = Decision("g0-plain", "adaptive_group_stay")
    assert policy.may_move(back)
    assert policy.moves(groups((1, 1)), back, [running(1800, "g0-eagle")]) == ["long"]
    assert not policy.may_move(back)


def test_the_long_answers_ending_after_the_last_arrival_do_not_raise_the_tail_a_drain_needs() -> None:
    # Once requests stop, the responses still ending are the longest of the traffic (129 tokens on average
    # here): 40 of 1,500 tokens pull the mean output past 1,000, but a 2,000-token answer still to come is
    # a tail against the traffic as it was while requests came.
    policy, last = quiet_plain_group()
    for _ in range(40):
        policy.observe(completion("g0-plain", FIELD_PLAIN, 1, tokens=1500))
    assert policy.describe()["beliefs"]["mean_output_tokens"] > 1000.0
    mark = policy.drain_mark(last + 0.01)
    assert mark is not None
    later = replace(groups((0, 1)), at=last + 0.01 + DRAIN_QUIET * GAP)
    assert policy.drain_moves(later, mark, [running(2000)]) == [("long", "g0-eagle")]
    assert policy.drain_moves(later, mark, [running(200)]) == []  # an ordinary answer of that traffic stays


def test_a_drain_prices_the_re_prefill_at_the_engines_prefill_cost() -> None:
    # Long prompts that EAGLE answered half a second after they arrived taught 500 us a prompt token to the
    # first token, queueing included; the engine itself counts 25 us a token of prefill, the stall a
    # re-prefill costs. An answer with a 20,000-token prompt saves about 1 ms a token on EAGLE.
    long_prompt = Running("long", "g0-plain", 10, 2010, 20_000.0)
    for engine in (0.0, 25e-6):
        policy, last = quiet_plain_group(engine)
        for _ in range(40):
            policy.observe(replace(completion("g0-eagle", FIELD_EAGLE, 1), prompt_tokens=1000, ttft=0.5))
        mark = policy.drain_mark(last + 0.01)
        assert mark is not None
        later = replace(groups((0, 1)), at=last + 0.01 + DRAIN_QUIET * GAP)
        assert policy.drain_moves(later, mark, [long_prompt]) == ([("long", "g0-eagle")] if engine else [])


def test_no_drain_while_requests_come() -> None:
    policy, last = quiet_plain_group()
    mark = policy.drain_mark(last + 0.01)
    assert mark is not None
    soon = replace(groups((0, 1)), at=last + 0.01 + 0.5 * DRAIN_QUIET * GAP)  # a few gaps since the last arrival
    assert policy.drain_moves(soon, mark, [running(2000)]) == []
    later = replace(groups((0, 1)), at=last + 0.01 + DRAIN_QUIET * GAP)
    policy.routed(replace(groups((0, 1)), at=last + 0.02), Decision("g0-plain", "adaptive_group_stay"))
    assert policy.drain_moves(later, mark, [running(2000)]) == []  # a request came after the response ended


def test_a_short_answer_an_eagle_group_or_the_config_keep_the_streams_where_they_are() -> None:
    policy, last = quiet_plain_group()
    mark = policy.drain_mark(last + 0.01)
    assert isinstance(mark, DrainMark)
    later = last + 0.01 + DRAIN_QUIET * GAP
    assert policy.drain_moves(replace(groups((0, 1)), at=later), mark, [running(100)]) == []  # a lull's ordinary answer
    policy.routed(replace(groups((0, 0)), at=last + 0.005), Decision("g0-eagle", "adaptive_group_switch"))
    mark = policy.drain_mark(last + 0.01)
    assert mark is not None
    assert policy.drain_moves(replace(groups((0, 1)), at=later), mark, [running(2000)]) == []  # the group speculates
    off = AdaptivePolicy.from_config(PolicyConfig(adaptive_drain=False))
    assert off.describe()["drain"] is False and off.drain_mark(1.0) is None
    assert AdaptivePolicy.from_config(PolicyConfig()).describe()["drain"] is True


def test_a_mark_counts_every_decision_of_the_gateway() -> None:
    policy, last = quiet_plain_group()
    mark = policy.drain_mark(last)
    assert mark is not None and mark.decisions == policy.lane.clock.decisions() > 0
