"""Cancelling the exchange that runs in the request's own task, and telling those cancellations from anyone else's.

The client leaving or the shutdown ends a proxied exchange by cancelling the request's task;
`ExchangeCancel` counts the cancellations the response asked for, so exactly those are absorbed
where the exchange is awaited and any other (the server cancelling the request) still propagates.
A move before the response's first byte cancels only the wait for it (`resend`), absorbed where the
request is sent, so that it is sent elsewhere.
(Why not a task of its own per exchange: docs/benchmarks/gateway-overhead.md.)
"""

from __future__ import annotations

import asyncio


class ExchangeCancel:
    """The request's task while its exchange runs (`running`), and the cancellations asked of it here."""

    __slots__ = ("_task", "_asked", "_resends")

    def __init__(self) -> None:
        self._task: asyncio.Task[object] | None = None
        self._asked = 0
        self._resends = 0

    def running(self, task: asyncio.Task[object] | None) -> None:
        """The exchange runs in `task` from now on (None: it stopped; later `cancel` calls do nothing)."""
        self._task = task

    def cancel(self) -> bool:
        """Cancel the exchange; False when it is not running."""
        return self._ask(resend=False)

    def absorb(self, task: asyncio.Task[object]) -> bool:
        """After a CancelledError in `task`: True when only this object's cancellations caused it (now undone)."""
        return _undone(task, self._asked)

    def resend(self) -> bool:
        """Cancel the exchange's wait for its backend's response, to send it elsewhere; False when it is not running."""
        return self._ask(resend=True)

    def take_resend(self, task: asyncio.Task[object]) -> bool:
        """After a CancelledError in `task` where it is sent: True when only `resend` caused it (now undone)."""
        resends, self._resends = self._resends, 0
        return _undone(task, resends)

    def _ask(self, *, resend: bool) -> bool:
        if self._task is None:
            return False
        if resend:
            self._resends += 1
        else:
            self._asked += 1
        self._task.cancel()
        return True


def _undone(task: asyncio.Task[object], count: int) -> bool:
    """Undo `count` cancellations of `task`; True when they were all it had."""
    for _ in range(count):
        task.uncancel()
    return count > 0 and task.cancelling() == 0
