"""The routing policies behind `gateway.policy.Policy`, and `make_policy` to build the configured one.

`static` holds the fixed rules (threshold, spill: one EAGLE + plain pair), `adaptive` the learning
one (K GPU groups), with `group_choice` its pure (group, mode) rule, `adaptive_state` what it keeps
per backend and reports per group, and `tpot_fit` the robust TPOT-vs-load fit it learns with;
`tier_rules` is how a request's service tier changes any of them.
"""

from __future__ import annotations

from gateway.config import PolicyConfig
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.static import SpillPolicy, ThresholdPolicy
from gateway.policies.tier_rules import TierSettings
from gateway.policy import Policy


def tier_settings(config: PolicyConfig) -> TierSettings:
    """The service tiers' lane as the `[policy]` table's `tier_*` keys configure it."""
    return TierSettings(config.tier_priority_headroom, config.tier_priority_slots, config.tier_priority_window)


def make_policy(config: PolicyConfig) -> Policy:
    """Build the policy the `[policy]` table configures (pass `Settings.resolved_policy`)."""
    if config.name == "threshold":
        return ThresholdPolicy(config.threshold, tier_settings(config))
    if config.name == "spill":
        return SpillPolicy(config.eagle_max_inflight, tier_settings(config))
    if config.name == "adaptive":
        return AdaptivePolicy.from_config(config, tier_settings(config))
    raise ValueError(f"unknown policy {config.name!r}")


__all__ = ["AdaptivePolicy", "SpillPolicy", "ThresholdPolicy", "make_policy"]
