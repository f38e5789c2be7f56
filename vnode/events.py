"""Virtual time: actions run in order of their time, then their phase, then the order they were scheduled.

Two phases order what happens at one instant as it happens on the wire: a step's end (`STEP_END`)
comes first, so its GPU starts its next step before anything a client does in reaction reaches a
server (`ARRIVAL`: a request sent, a think time over). No clock is read: `now` is the time of the
action running. A look-ahead action (`at(..., look=True)`: a router checking on its running requests)
does not keep time going: once only such actions are left, time stops at the last other one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

STEP_END, ARRIVAL = 0, 1

Action = Callable[..., None]


class EventQueue:
    """The pending actions of one simulated node and the virtual time, in seconds."""

    __slots__ = ("_heap", "_kept", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, bool, Action, tuple[Any, ...]]] = []
        self._seq = 0
        self._kept = 0  # actions pending that are not look-aheads

    def at(self, when: float, phase: int, action: Action, *args: Any, look: bool = False) -> None:
        """Run `action(*args)` at `when` (not before `now`) in `phase`; `look`: a look-ahead (module docstring)."""
        self._seq += 1
        self._kept += not look
        heapq.heappush(self._heap, (max(when, self.now), phase, self._seq, look, action, args))

    def run(self) -> None:
        """Run actions, and those they schedule, until only look-aheads are left (they are dropped); `now`
        is then the last action's time."""
        heap, pop = self._heap, heapq.heappop
        while self._kept:
            when, _, _, look, action, args = pop(heap)
            self._kept -= not look
            self.now = when
            action(*args)
        heap.clear()
