"""Virtual time: actions run in order of their time, then their phase, then the order they were scheduled.

Two phases order what happens at one instant as it happens on the wire: a step's end (`STEP_END`)
comes first, so its GPU starts its next step before anything a client does in reaction reaches a
server (`ARRIVAL`: a request sent, a think time over). No clock is read: `now` is the time of the
action running.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

STEP_END, ARRIVAL = 0, 1

Action = Callable[..., None]


class EventQueue:
    """The pending actions of one simulated node and the virtual time, in seconds."""

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Action, tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, when: float, phase: int, action: Action, *args: Any) -> None:
        """Run `action(*args)` at `when` (not before `now`) in `phase`."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), phase, self._seq, action, args))

    def run(self) -> None:
        """Run actions, and those they schedule, until none is left; `now` is then the last one's time."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            when, _, _, action, args = pop(heap)
            self.now = when
            action(*args)
