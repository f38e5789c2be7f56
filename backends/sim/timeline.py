"""The simulated GPU: a timeline on which steps run one after another, on absolute deadlines."""

from __future__ import annotations

import asyncio


class Timeline:
    """One GPU (or GPU group). Engines that share a timeline serialize their steps on it.

    `lock` is held for the whole of a step, and asyncio's lock wakes waiters first-come first-served,
    so two busy engines on one timeline alternate. `free_at` is the modelled end of the last step
    (`time.monotonic()`): the next step starts there, not when the loop got round to it, so timer
    jitter does not accumulate into the modelled timeline.
    """

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.free_at = 0.0

    def reserve(self, ready_at: float, duration: float) -> tuple[float, float]:
        """Book the next step of `duration` seconds for an engine ready at `ready_at`: its (start, end)."""
        start = max(self.free_at, ready_at)
        end = start + duration
        self.free_at = end
        return start, end
