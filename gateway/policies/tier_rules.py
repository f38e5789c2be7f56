"""How a request's service tier changes the routing decision, as pure functions of the backends.

- `priority` is routed by the policy's own rule on the true predictions and the whole EAGLE cap:
  the fastest predicted option. It is never the request a probe sends to a slower backend.
- `default` (and `auto`) is today's rule exactly, until a priority request is seen. From then on,
  for `window` decisions after the last one, default traffic leaves a lane on the EAGLE servers:
  a partitioned EAGLE backend (alone in its group) is predicted `1 / (1 - headroom)` times slower
  than its line says, so default traffic moves to plain decode while EAGLE would still be up to
  `headroom` faster, and the `slots` last slots of every EAGLE cap are for priority requests only.
  Greedy routing equalizes TPOT across backends; with the lane, default traffic settles where
  EAGLE's TPOT is `(1 - headroom)` times plain's, which is what a priority request then gets.
  Co-located groups keep their mode rule (a priority request on EAGLE while its group decodes
  plain would interleave both servers' steps and slow everyone): there the lane is the slots only.
- `flex` goes where it costs the node least: a plain backend that does not share its GPUs with a
  busy EAGLE server (the plain server with the lowest predicted TPOT), never adding a speculative
  request; only when there is none does it follow default traffic's rule. It is also the first
  refused under overload (gateway/tiers.py `flex_admitted`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gateway.policies.group_choice import BackendState, TpotLine
from gateway.pool import PoolSnapshot
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
    board is the clock (gateway/board.py), so every worker keeps the same lane."""

    def tick(self, priority: bool) -> None:
        """Count one decision; `priority`: it was a priority request's."""

    def since_priority(self) -> int | None:
        """Decisions since the last priority one (0: it was the last); None: never one."""


class DecisionClock:
    """The lane clock of a gateway of one process."""

    def __init__(self) -> None:
        self._decisions = 0
        self._priority_at = 0  # the last priority decision's number; 0: none yet

    def tick(self, priority: bool) -> None:
        self._decisions += 1
        if priority:
            self._priority_at = self._decisions

    def since_priority(self) -> int | None:
        return self._decisions - self._priority_at if self._priority_at else None


class TierLane:
    """Whether priority traffic is present (a priority request within the last `window` decisions),
    and the backends as default and flex traffic see them while it is."""

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

    def view(self, states: list[BackendState], tier: Tier) -> list[BackendState]:
        """The backends as a request of `tier` must see them: priority, and everyone while no
        priority traffic is present, see them as they are."""
        if tier == PRIORITY or not self.active:
            return states
        return lane_view(states, self.settings)

    def describe(self) -> dict[str, Any]:
        return {
            "priority_headroom": self.settings.headroom,
            "priority_slots": self.settings.slots,
            "priority_window": self.settings.window,
            "priority_lane_active": self.active,
            "decisions_since_priority": self.clock.since_priority(),
        }


def lane_view(states: list[BackendState], settings: TierSettings) -> list[BackendState]:
    """Default traffic's view while the lane is kept: partitioned EAGLE lines scaled up by
    `1 / (1 - headroom)`, every EAGLE cap short of `slots`."""
    sizes = Counter(s.group for s in states)
    scale = 1.0 / (1.0 - settings.headroom)
    out = []
    for s in states:
        if not s.speculative:
            out.append(s)
            continue
        line = s.line
        if line is not None and sizes[s.group] == 1:
            line = TpotLine(line.alpha * scale, line.beta * scale)
        cap = max(s.cap - settings.slots, 0) if s.cap is not None else None
        out.append(replace(s, line=line, cap=cap))
    return out


def flex_choice(states: list[BackendState]) -> str | None:
    """The plain backend where a flex request costs the node least; None when there is none.

    Only plain backends whose group runs no EAGLE request count (co-located, a plain request next to a
    speculating server would interleave both servers' steps); among them the lowest predicted TPOT at
    the group's load, the least-loaded group before any line is fitted.
    """
    loads: Counter[str] = Counter()
    speculating = set()
    for s in states:
        loads[s.group] += s.inflight
        if s.speculative and s.inflight > 0:
            speculating.add(s.group)
    plain = [s for s in states if not s.speculative and s.open and s.group not in speculating]
    if not plain:
        return None

    def cost(s: BackendState) -> tuple[float, int, str]:
        predicted = s.line.at(loads[s.group] + 1) if s.line is not None else 0.0
        return predicted, loads[s.group], s.name

    return min(plain, key=cost).name


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
