"""One timer per client connection for a request head or body its client is too slow to send.

A connection waits on its client in two phases: the request head (from the first byte of a request,
or from its accept for a connection that has sent nothing yet) and the request body (the longest
gap between two reads). Rather than a timer per read, a connection keeps one deadline and at most
one timer: a read only moves the deadline; when the timer fires it compares the clock with the
deadline and either re-arms at the deadline or asks the connection to end. A kept-alive connection
serving request after request so arms about one timer per timeout, whatever its request rate.
(What it costs per request and per chunk: docs/benchmarks/client-limits.md.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import Enum


class Phase(Enum):
    """What the connection waits for from its client."""

    FRESH = "fresh"  # accepted, nothing received yet
    HEAD = "head"  # a request head has begun
    BODY = "body"  # the head is complete, its body is arriving
    IDLE = "idle"  # nothing: the request is read (its response runs, or uvicorn's keep-alive timer watches)


class ReadDeadline:
    """The deadline of one connection's current phase and the one timer that enforces it.

    `on_expired(phase)` is called once the deadline has passed: it ends the connection and returns
    True, or returns False when the wait is the server's (a response still running, reading paused),
    which restarts the phase's full timeout. `close` cancels the timer (the connection is gone).
    """

    __slots__ = ("_loop", "_head_timeout", "_body_timeout", "_on_expired", "phase", "deadline", "_timer", "_timer_at")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, head_timeout: float, body_timeout: float, on_expired: Callable[[Phase], bool]
    ) -> None:
        self._loop = loop
        self._head_timeout = head_timeout
        self._body_timeout = body_timeout
        self._on_expired = on_expired
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.phase = Phase.FRESH
        self.deadline = 0.0
        self._move(loop.time() + head_timeout)

    def head(self) -> None:
        """A request head begins now."""
        self.phase = Phase.HEAD
        self._move(self._loop.time() + self._head_timeout)

    def body(self) -> None:
        """The head is complete, or a piece of the body arrived: the next must come within the body timeout."""
        self.phase = Phase.BODY
        self._move(self._loop.time() + self._body_timeout)

    def idle(self) -> None:
        """The request is read; a timer still armed finds nothing to do and is not re-armed."""
        self.phase = Phase.IDLE

    def close(self) -> None:
        """The connection is gone: cancel the timer, and let go of the connection (`on_expired` refers
        to it: a cycle that would wait for the garbage collector)."""
        self.phase = Phase.IDLE
        self._on_expired = _gone
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _move(self, deadline: float) -> None:
        self.deadline = deadline
        if self._timer is None or deadline < self._timer_at:  # later deadlines wait for the timer to fire
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._fire)
        self._timer_at = at

    def _fire(self) -> None:
        self._timer = None
        phase = self.phase
        if phase is Phase.IDLE:
            return
        now = self._loop.time()
        if now < self.deadline:
            self._arm(self.deadline)
        elif not self._on_expired(phase):
            self._move(now + (self._body_timeout if phase is Phase.BODY else self._head_timeout))


def _gone(phase: Phase) -> bool:
    return True
