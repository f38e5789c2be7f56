"""The idle timeout of a relayed stream: one timer per stream, re-armed only when it fires.

The relays (`sse.py`, `frames.py`) mark when a read begins and ends, and the one timer checks that
mark, instead of a timeout context around each read (docs/benchmarks/design-notes.md#idle-timers).
"""

from __future__ import annotations

import asyncio


class IdleWatch:
    """Cancels the relaying task when one read waits longer than `timeout`; one timer per stream."""

    __slots__ = ("_loop", "_task", "_timeout", "_handle", "_base", "reading_since", "fired")

    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "the relay runs in a task"
        self._task = task
        self._base = task.cancelling()
        self._timeout = timeout
        self.reading_since: float | None = None  # loop time the current read began; None between reads
        self.fired = False
        self._handle = self._loop.call_at(self._loop.time() + timeout, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        since = self.reading_since
        if since is None or now < since + self._timeout:
            # Not reading (sending to a slow client is no upstream silence), or the read began later.
            self._handle = self._loop.call_at((since if since is not None else now) + self._timeout, self._check)
            return
        self.fired = True
        self._task.cancel()

    def timed_out(self) -> bool:
        """After a CancelledError: True when this watch caused it (and nobody else cancelled too)."""
        return self.fired and self._task.uncancel() <= self._base

    def close(self) -> None:
        self._handle.cancel()
