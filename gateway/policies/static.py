"""The fixed routing rules: `threshold` (total load) and `spill` (EAGLE's own load)."""

from __future__ import annotations

from typing import Any

from gateway.policy import Decision, Policy
from gateway.pool import PoolSnapshot


class ThresholdPolicy(Policy):
    """EAGLE while the total in-flight before this request is below `threshold`, else plain."""

    name = "threshold"

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def choose(self, snapshot: PoolSnapshot) -> Decision:
        if snapshot.total_inflight < self.threshold:
            return Decision(snapshot.speculative.name, "below_threshold")
        return Decision(snapshot.plain.name, "at_or_above_threshold")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold}


class SpillPolicy(Policy):
    """EAGLE while its own in-flight is below `eagle_max_inflight`, the overflow to plain.

    Under load this keeps the EAGLE server busy at its sweet spot instead of idle, so in a
    partitioned node its GPUs add to the plain server's throughput.
    """

    name = "spill"

    def __init__(self, eagle_max_inflight: int) -> None:
        self.eagle_max_inflight = eagle_max_inflight

    def choose(self, snapshot: PoolSnapshot) -> Decision:
        if snapshot.speculative.inflight < self.eagle_max_inflight:
            return Decision(snapshot.speculative.name, "eagle_below_cap")
        return Decision(snapshot.plain.name, "eagle_at_cap")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "eagle_max_inflight": self.eagle_max_inflight}
