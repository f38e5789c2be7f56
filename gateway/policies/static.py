"""The fixed routing rules: `threshold` (total load) and `spill` (EAGLE's own load), with service tiers.

A priority request goes to EAGLE while it holds fewer than its priority limit (threshold: the larger
of the threshold and the lane's slots; spill: its cap), a flex request to plain; while priority
traffic is present, spill's default traffic stops the lane's slots short of its cap. Without
priority traffic both rules route exactly as their names say.
"""

from __future__ import annotations

from typing import Any

from gateway.policies import Decision, Policy, Prompt
from gateway.policies.lane import TierLane, TierSettings, static_choice
from gateway.pool.snapshot import PoolSnapshot
from gateway.tiers import DEFAULT, Tier


class ThresholdPolicy(Policy):
    """EAGLE while the total in-flight before this request is below `threshold`, else plain."""

    name = "threshold"

    def __init__(self, threshold: int, tiers: TierSettings | None = None) -> None:
        self.threshold = threshold
        self.lane = TierLane(tiers)

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        tiered = static_choice(snapshot, tier, max(self.threshold, self.lane.settings.slots))
        if tiered is not None:
            return Decision(*tiered, tier)
        if snapshot.total_inflight < self.threshold:
            return Decision(snapshot.speculative.name, "below_threshold", tier)
        return Decision(snapshot.plain.name, "at_or_above_threshold", tier)

    def routed(self, snapshot: PoolSnapshot, decision: Decision, prompt: Prompt | None = None) -> None:
        self.lane.routed(decision.tier)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold}

    def tiers(self) -> dict[str, Any]:
        return self.lane.describe()


class SpillPolicy(Policy):
    """EAGLE while its own in-flight is below `eagle_max_inflight`, the overflow to plain.

    Under load this keeps the EAGLE server busy at its sweet spot instead of idle, so in a
    partitioned node its GPUs add to the plain server's throughput.
    """

    name = "spill"

    def __init__(self, eagle_max_inflight: int, tiers: TierSettings | None = None) -> None:
        self.eagle_max_inflight = eagle_max_inflight
        self.lane = TierLane(tiers)

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        tiered = static_choice(snapshot, tier, self.eagle_max_inflight)
        if tiered is not None:
            return Decision(*tiered, tier)
        reserved = self.lane.settings.slots if self.lane.active else 0
        if snapshot.speculative.inflight < self.eagle_max_inflight - reserved:
            return Decision(snapshot.speculative.name, "eagle_below_cap", tier)
        return Decision(snapshot.plain.name, "eagle_at_cap", tier)

    def routed(self, snapshot: PoolSnapshot, decision: Decision, prompt: Prompt | None = None) -> None:
        self.lane.routed(decision.tier)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "eagle_max_inflight": self.eagle_max_inflight}

    def tiers(self) -> dict[str, Any]:
        return self.lane.describe()
