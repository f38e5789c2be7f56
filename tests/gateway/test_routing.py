"""Routing rules on hand-built snapshots: each policy is a pure function of the pool."""

from __future__ import annotations

import pytest

from gateway.config import PolicyConfig
from gateway.policies import Decision, failover, route
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.factory import make_policy
from gateway.policies.static import SpillPolicy, ThresholdPolicy
from gateway.pool.snapshot import BackendView, PoolSnapshot


def snap(eagle: int, plain: int, *, eagle_up: bool = True, plain_up: bool = True) -> PoolSnapshot:
    return PoolSnapshot(
        (BackendView("eagle", True, eagle_up, eagle), BackendView("plain", False, plain_up, plain))
    )


@pytest.mark.parametrize(
    ("eagle", "plain", "expected"),
    [(0, 0, "eagle"), (1, 0, "eagle"), (0, 1, "eagle"), (1, 1, "plain"), (2, 0, "plain"), (0, 5, "plain")],
)
def test_threshold_counts_total_inflight_before_the_request(eagle: int, plain: int, expected: str) -> None:
    assert ThresholdPolicy(2).choose(snap(eagle, plain)).backend == expected


def test_threshold_zero_sends_everything_to_plain() -> None:
    assert ThresholdPolicy(0).choose(snap(0, 0)) == Decision("plain", "at_or_above_threshold")


@pytest.mark.parametrize(("eagle", "plain", "expected"), [(0, 100, "eagle"), (47, 0, "eagle"), (48, 0, "plain"), (60, 3, "plain")])
def test_spill_looks_only_at_eagle_inflight(eagle: int, plain: int, expected: str) -> None:
    assert SpillPolicy(48).choose(snap(eagle, plain)).backend == expected


def test_unavailable_choice_falls_back_to_the_other() -> None:
    assert route(ThresholdPolicy(2), snap(0, 0, eagle_up=False)) == Decision("plain", "fallback_unavailable")
    assert route(ThresholdPolicy(2), snap(5, 5, plain_up=False)) == Decision("eagle", "fallback_unavailable")


def test_nothing_available_means_no_decision() -> None:
    assert route(ThresholdPolicy(2), snap(0, 0, eagle_up=False, plain_up=False)) is None


def test_forced_route_wins_but_is_never_moved() -> None:
    assert route(ThresholdPolicy(2), snap(10, 10), forced="eagle") == Decision("eagle", "forced")
    assert route(ThresholdPolicy(2), snap(0, 0, plain_up=False), forced="plain") is None


def test_failover_goes_to_another_available_backend_or_nowhere() -> None:
    # The refused backend is marked down before failover decides.
    assert failover(ThresholdPolicy(2), snap(1, 0, eagle_up=False), "eagle") == Decision("plain", "failover_retry")
    assert failover(SpillPolicy(4), snap(0, 1, plain_up=False), "plain") == Decision("eagle", "failover_retry")
    assert failover(ThresholdPolicy(2), snap(1, 0, eagle_up=False, plain_up=False), "eagle") is None


def test_make_policy_builds_the_configured_one() -> None:
    assert isinstance(make_policy(PolicyConfig(name="threshold", threshold=4)), ThresholdPolicy)
    assert isinstance(make_policy(PolicyConfig(name="spill", eagle_max_inflight=12)), SpillPolicy)
    assert isinstance(make_policy(PolicyConfig(name="adaptive")), AdaptivePolicy)


@pytest.mark.parametrize(
    ("values", "cap"),
    [
        ({"name": "threshold", "threshold": 4}, 4),
        ({"name": "threshold", "threshold": 0}, 1),
        ({"name": "spill", "eagle_max_inflight": 12}, 12),
        ({"name": "spill", "eagle_max_inflight": 0}, 1),
        ({"name": "adaptive", "adaptive_eagle_cap": 64}, 64),
        ({"name": "adaptive"}, 128),
    ],
)
def test_eagle_cap_is_a_plain_value_of_the_config(values: dict[str, object], cap: int) -> None:
    assert PolicyConfig.model_validate(values).eagle_cap == cap


def test_group_inflight_sums_the_backends_sharing_gpus() -> None:
    shared = PoolSnapshot((BackendView("eagle", True, True, 3, "g0"), BackendView("plain", False, True, 2, "g0")))
    assert shared.group_inflight(shared.get("eagle")) == 5
    alone = snap(3, 2)  # no group named: each backend is a group of its own
    assert alone.get("eagle").group == "eagle" and alone.group_inflight(alone.get("eagle")) == 3
