"""The routing policies behind `gateway.policy.Policy`, and `make_policy` to build the configured one.

`static` holds the fixed rules (threshold, spill: one EAGLE + plain pair), `adaptive` the learning
one (K GPU groups), with `group_choice` its pure (group, mode) rule, `adaptive_state` what it keeps
per backend and reports per group, and `tpot_fit` the robust TPOT-vs-load fit it learns with.
"""

from __future__ import annotations

from gateway.config import PolicyConfig
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.static import SpillPolicy, ThresholdPolicy
from gateway.policy import Policy


def make_policy(config: PolicyConfig) -> Policy:
    """Build the policy the `[policy]` table configures (pass `Settings.resolved_policy`)."""
    if config.name == "threshold":
        return ThresholdPolicy(config.threshold)
    if config.name == "spill":
        return SpillPolicy(config.eagle_max_inflight)
    if config.name == "adaptive":
        return AdaptivePolicy.from_config(config)
    raise ValueError(f"unknown policy {config.name!r}")


__all__ = ["AdaptivePolicy", "SpillPolicy", "ThresholdPolicy", "make_policy"]
