"""The service tiers' lane: whether priority traffic is present, and the fixed rules' tier choices.

A priority request within the last `window` routing decisions makes default traffic leave a lane on
the EAGLE servers: the policy shapes it (the adaptive one with `rules.lane_view`: partitioned EAGLE
lines scaled by `1 / (1 - headroom)`, the last `slots` of every EAGLE cap kept for priority), and
the lane's clock is the gateway's (the pool's board), so a priority request seen by one worker
keeps the lane in all. `static_choice` is how the fixed rules (one EAGLE + plain pair) serve tiers.
The rules in full: docs/adaptive.md, "Service tiers".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.pool.board import DecisionClock
from gateway.pool.snapshot import PoolSnapshot
from gateway.tiers import FLEX, PRIORITY, Tier

FLEX_PLAIN = "tier_flex_plain"  # flex sent to plain decode
PRIORITY_EAGLE = "tier_priority_eagle"  # a static policy sent a priority request to EAGLE


@dataclass(frozen=True)
class TierSettings:
    """The lane's size and how long it is kept (the `[policy]` table's `tier_*` keys)."""

    headroom: float = 0.35
    slots: int = 8
    window: int = 1000

    def __post_init__(self) -> None:
        if not 0.0 <= self.headroom < 1.0:
            raise ValueError(f"priority headroom must be in [0, 1), got {self.headroom}")
        if self.slots < 0 or self.window < 1:
            raise ValueError(f"priority slots must be >= 0 and window >= 1, got {self.slots}, {self.window}")


class LaneClock(Protocol):
    """Counts routing decisions and remembers the last priority one. With several workers the load
    board is the clock (gateway/pool/board.py), so every worker keeps the same lane."""

    def tick(self, priority: bool) -> None:
        """Count one decision; `priority`: it was a priority request's."""

    def since_priority(self) -> int | None:
        """Decisions since the last priority one (0: it was the last); None: never one."""

    def decisions(self) -> int:
        """Decisions counted so far (every worker's, on the board)."""


class TierLane:
    """Whether priority traffic is present: a priority request within the last `window` decisions."""

    def __init__(self, settings: TierSettings | None = None) -> None:
        self.settings = settings or TierSettings()
        self.clock: LaneClock = DecisionClock()

    def share(self, clock: LaneClock) -> None:
        """Count decisions on `clock` (the workers' board) from now on."""
        self.clock = clock

    @property
    def active(self) -> bool:
        """Whether default traffic currently leaves the lane free."""
        since = self.clock.since_priority()
        return since is not None and since < self.settings.window

    def routed(self, tier: Tier) -> None:
        """Count one decision of `tier`."""
        self.clock.tick(tier == PRIORITY)

    def describe(self) -> dict[str, Any]:
        return {
            "priority_headroom": self.settings.headroom,
            "priority_slots": self.settings.slots,
            "priority_window": self.settings.window,
            "priority_lane_active": self.active,
            "decisions_since_priority": self.clock.since_priority(),
        }


def static_choice(snapshot: PoolSnapshot, tier: Tier, eagle_limit: int) -> tuple[str, str] | None:
    """The fixed rules' tiers (one EAGLE + plain pair): priority to EAGLE while it holds fewer than
    `eagle_limit` requests, flex to plain; None: the policy's own rule decides."""
    if tier == PRIORITY:
        eagle = snapshot.speculative
        if eagle.available and eagle.inflight < eagle_limit:
            return eagle.name, PRIORITY_EAGLE
    elif tier == FLEX and snapshot.plain.available:
        return snapshot.plain.name, FLEX_PLAIN
    return None
