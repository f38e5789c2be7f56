"""Service tiers: the routing rules on hand-built snapshots, and the edge's parsing and echo.

The adaptive policy is trained on exact lines (tests/gateway/test_adaptive.py's helpers), so each
decision below can be worked out by hand: field-8gpu's EAGLE TPOT(n) = 1.94 + 2.82n ms, plain
4.53 + 1.294n ms.
"""

from __future__ import annotations

import orjson
import pytest

from backends.config import LaunchConfig
from backends.sglang_args import PRIORITY_SCHEDULING_FLAG, with_priority_scheduling
from gateway.config import PolicyConfig, Settings
from gateway.dialects.openai import echo_json, stream_echo
from gateway.errors import OpenAIError
from gateway.policies import Decision, failover, route
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.factory import make_policy
from gateway.policies.lane import FLEX_PLAIN, PRIORITY_EAGLE, TierLane, TierSettings
from gateway.policies.static import SpillPolicy, ThresholdPolicy
from gateway.tiers import DEFAULT, FLEX, PRIORITY, admit_tier, flex_admitted, requested_tier
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN, LLAMA_EAGLE, LLAMA_PLAIN, shared, snap, steady, trained


def priority_seen(policy: AdaptivePolicy | ThresholdPolicy | SpillPolicy) -> None:
    """A priority request was just placed on EAGLE: priority traffic is present."""
    policy.routed(snap(0, 0), Decision("eagle", "adaptive_predicted_faster", PRIORITY))


def test_priority_keeps_eagle_where_default_is_pushed_to_plain() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN)
    # EAGLE(2) = 7.59 ms < plain(3) = 8.41 ms: without priority traffic, default speculates.
    assert steady(policy, 1, 2) == Decision("eagle", "adaptive_predicted_faster")
    priority_seen(policy)
    # With the lane (headroom 0.35) default sees EAGLE(2) as 7.59 / 0.65 = 11.7 ms > 8.41: plain.
    assert steady(policy, 1, 2) == Decision("plain", "adaptive_predicted_faster")
    # The priority request itself sees the true lines: EAGLE.
    assert policy.choose(snap(1, 2), PRIORITY) == Decision("eagle", "adaptive_predicted_faster", PRIORITY)
    # Where plain is faster for everyone, priority goes there too: EAGLE(4) = 13.2 > plain(1) = 5.82.
    assert policy.choose(snap(3, 0), PRIORITY).backend == "plain"


def test_the_lane_closes_a_window_after_the_last_priority_request() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN, tiers=TierSettings(window=10))
    priority_seen(policy)
    assert steady(policy, 1, 2).backend == "plain"  # steady routes two default requests first
    for _ in range(3):
        steady(policy, 0, 0)
    assert policy.tiers()["priority_lane_active"] is True
    assert steady(policy, 1, 2).backend == "eagle"  # ten default decisions since: the lane is gone
    assert policy.tiers()["priority_lane_active"] is False


def test_priority_slots_of_the_eagle_cap_are_kept_for_priority() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, eagle_cap=48, tiers=TierSettings(headroom=0.0, slots=8))
    assert steady(policy, 40, 0) == Decision("eagle", "adaptive_predicted_faster")
    priority_seen(policy)
    # Default traffic stops 8 short of the cap; priority still gets those 8.
    assert steady(policy, 40, 0) == Decision("plain", "adaptive_cap")
    assert policy.choose(snap(40, 0), PRIORITY).backend == "eagle"
    assert policy.choose(snap(47, 0), PRIORITY).backend == "eagle"
    assert policy.choose(snap(48, 0), PRIORITY).backend == "plain"


def test_priority_is_never_a_probe() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, probe_every=5)
    for _ in range(6):  # plain gets nothing: a probe of it is due on an idle plain server
        policy.routed(snap(0, 0), Decision("eagle", "adaptive_predicted_faster"))
    assert policy.choose(snap(1, 0)) == Decision("plain", "adaptive_explore")
    assert policy.choose(snap(1, 0), PRIORITY) == Decision("eagle", "adaptive_predicted_faster", PRIORITY)


def test_flex_goes_to_plain_decode() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN)
    assert steady(policy, 0, 5) == Decision("eagle", "adaptive_predicted_faster")  # EAGLE(1) 4.76 < plain(6) 12.3
    recent = policy.choose(snap(0, 5), FLEX)
    assert recent == Decision("plain", FLEX_PLAIN, FLEX)


def test_flex_never_makes_a_colocated_group_mix_modes() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, colocated=True)
    # The group speculates: a plain request beside it would interleave both servers' steps.
    assert policy.choose(shared(3, 0), FLEX).backend == "eagle"
    assert policy.choose(shared(0, 3), FLEX) == Decision("plain", FLEX_PLAIN, FLEX)


def test_default_traffic_is_unchanged_without_priority_traffic() -> None:
    grid = [(e, p) for e in range(0, 30, 3) for p in range(0, 30, 4)]
    plain_policy, tiered = trained(FIELD_EAGLE, FIELD_PLAIN), trained(FIELD_EAGLE, FIELD_PLAIN)
    for e, p in grid:
        tiered.routed(snap(e, p), Decision("plain", FLEX_PLAIN, FLEX))  # flex traffic opens no lane
        assert steady(tiered, e, p) == steady(plain_policy, e, p)


def test_static_policies_serve_the_tiers() -> None:
    threshold = ThresholdPolicy(1)
    assert threshold.choose(snap(3, 3), PRIORITY) == Decision("eagle", PRIORITY_EAGLE, PRIORITY)
    assert threshold.choose(snap(8, 0), PRIORITY) == Decision("plain", "at_or_above_threshold", PRIORITY)
    assert threshold.choose(snap(0, 0), FLEX) == Decision("plain", FLEX_PLAIN, FLEX)
    assert threshold.choose(snap(0, 0)) == Decision("eagle", "below_threshold")
    spill = SpillPolicy(4, TierSettings(slots=2))
    assert spill.choose(snap(2, 0)) == Decision("eagle", "eagle_below_cap")
    priority_seen(spill)
    assert spill.choose(snap(2, 0)) == Decision("plain", "eagle_at_cap")
    assert spill.choose(snap(3, 0), PRIORITY) == Decision("eagle", PRIORITY_EAGLE, PRIORITY)


def test_route_and_failover_carry_the_tier_into_the_label() -> None:
    decision = route(ThresholdPolicy(1), snap(0, 0), tier=PRIORITY)
    assert decision == Decision("eagle", PRIORITY_EAGLE, PRIORITY)
    assert decision.label == "priority:tier_priority_eagle"
    assert route(ThresholdPolicy(1), snap(0, 0)).label == "below_threshold"  # type: ignore[union-attr]
    moved = failover(ThresholdPolicy(1), snap(0, 0, eagle_up=False), "eagle", FLEX)
    assert moved == Decision("plain", "failover_retry", FLEX)
    assert route(ThresholdPolicy(1), snap(0, 0), forced="plain", tier=FLEX) == Decision("plain", "forced", FLEX)


def test_configured_through_the_policy_table() -> None:
    config = PolicyConfig(tier_priority_headroom=0.5, tier_priority_slots=3, tier_priority_window=7)
    tiers = make_policy(config).tiers()
    assert tiers is not None
    assert (tiers["priority_headroom"], tiers["priority_slots"], tiers["priority_window"]) == (0.5, 3, 7)
    assert make_policy(PolicyConfig(name="spill")).tiers() == TierLane().describe()  # the defaults agree
    with pytest.raises(ValueError):
        PolicyConfig(tier_priority_headroom=1.0)


@pytest.mark.parametrize(
    ("field", "header", "expected"),
    [
        (None, None, None),
        ("auto", None, DEFAULT),
        ("scale", None, DEFAULT),
        ("priority", "flex", PRIORITY),
        (None, " Flex ", FLEX),
        (None, "default", DEFAULT),
    ],
)
def test_requested_tier(field: str | None, header: str | None, expected: str | None) -> None:
    assert requested_tier(field, header) == expected


@pytest.mark.parametrize(("field", "header", "param"), [("urgent", None, "service_tier"), (None, "gold", "x-specgate-service-tier")])
def test_unknown_tier_is_a_400_naming_its_source(field: str | None, header: str | None, param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        requested_tier(field, header)
    assert caught.value.status == 400 and caught.value.param == param


def test_flex_is_refused_first_under_overload() -> None:
    assert flex_admitted(74, 100, 0.75) and not flex_admitted(75, 100, 0.75)
    admit_tier(PRIORITY, 99, 100, 0.75)  # other tiers are left to the gateway's own limit
    admit_tier(DEFAULT, 99, 100, 0.75)
    with pytest.raises(OpenAIError) as caught:
        admit_tier(FLEX, 75, 100, 0.75)
    assert caught.value.status == 429 and "Retry-After" in caught.value.headers


def test_the_echo_names_the_tier_in_json_and_in_each_event() -> None:
    assert orjson.loads(echo_json(b'{"id": "x", "choices": []}', PRIORITY))["service_tier"] == "priority"
    assert echo_json(b"[1]", PRIORITY) == b"[1]"
    echo = stream_echo(FLEX)
    event = b'data: {"id":"c","choices":[{"delta":{"content":"hi"}}]}\n\n'
    out = echo(event)
    assert out.startswith(b"data: {") and out.endswith(b"\n\n")
    assert orjson.loads(out[6:]) == {"service_tier": "flex", **orjson.loads(event[6:])}
    assert echo(b'data: {"service_tier":"default","id":"c"}\n\n') == b'data: {"service_tier":"default","id":"c"}\n\n'
    assert echo(b"data: {}\n\n") == b"data: {}\n\n"


def test_sglang_priority_scheduling_is_launched_only_for_real_sglang() -> None:
    sglang = LaunchConfig(engine="sglang", model_path="m", draft_model_path="d")
    launched = with_priority_scheduling(sglang)
    assert launched.eagle.extra_args == [PRIORITY_SCHEDULING_FLAG] == launched.plain.extra_args
    assert with_priority_scheduling(launched) == launched
    assert with_priority_scheduling(LaunchConfig()) == LaunchConfig()
    settings = Settings(policy=PolicyConfig(tier_sglang_priority=True), launch=sglang)
    assert PRIORITY_SCHEDULING_FLAG in settings.planned_launch.plain.extra_args
    assert Settings(launch=sglang).planned_launch == sglang


def test_the_launch_plan_starts_sglang_with_priority_scheduling() -> None:
    from backends.plan import build_plan

    launch = LaunchConfig(engine="sglang", model_path="m", draft_model_path="d")
    settings = Settings(policy=PolicyConfig(tier_sglang_priority=True), launch=launch)
    plan = build_plan(settings.planned_launch, eagle_cap=settings.resolved_policy.eagle_cap, free_port=lambda: 30000)
    assert all(PRIORITY_SCHEDULING_FLAG in p.argv for p in plan.processes) and len(plan.processes) == 2
