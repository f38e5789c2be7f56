"""`make_policy`: the policy the `[policy]` table configures."""

from __future__ import annotations

from gateway.config import PolicyConfig
from gateway.policies import Policy
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.lane import TierSettings
from gateway.policies.static import SpillPolicy, ThresholdPolicy


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

