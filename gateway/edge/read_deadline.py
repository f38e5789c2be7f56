"""One timer per client connection for a request head or body its client is too slow to send.

A connection waits on its client in two phases: the request head (from the first byte of a request,
or from its accept for a connection that has sent nothing yet) and the request body (the longest
gap between two reads). Rather than a timer per read, a connection keeps one deadline and at most
one timer: a read only moves the deadline; when the timer fires it compares the clock with the
deadline and either re-arms at the deadline or asks the connection to end. A kept-alive connection
serving request after request so arms about one timer per timeout, whatever its request rate.
(What it costs per request and per connection: docs/benchmarks/client-limits.md.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

# What the connection waits for from its client. Plain strings compared by identity: the per-read
# path reads them as module globals, cheaper than an Enum's members.
Phase = Literal["fresh", "head", "body", "idle"]
FRESH: Phase = "fresh"  # accepted, nothing received yet
HEAD: Phase = "head"  # a request head has begun
BODY: Phase = "body"  # the head is complete, its body is arriving
IDLE: Phase = "idle"  # nothing: the request is read (its response runs, or uvicorn's keep-alive timer watches)


class ReadDeadline:
    """The deadline of one connection's current phase and the one timer that enforces it.

    `head(now)` and `body(now)` start a phase at `now` (the loop's time of the read that starts or
    continues it). `on_expired(phase)` is called once the deadline has passed: it ends the
    connection and returns True, or returns False when the wait is the server's (a response still
    running, reading paused), which restarts the phase's full timeout. `close` cancels the timer
    (the connection is gone) and lets go of `on_expired`.
    """

    __slots__ = ("_loop", "_head_timeout", "_body_timeout", "_on_expired", "phase", "deadline", "_timer", "_timer_at")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, head_timeout: float, body_timeout: float, on_expired: Callable[[Phase], bool]
    ) -> None:
        self._loop = loop
        self._head_timeout = head_timeout
        self._body_timeout = body_timeout
        self._on_expired = on_expired
        self.phase: Phase = FRESH
        self.deadline = at = loop.time() + head_timeout
        self._timer: asyncio.TimerHandle | None = loop.call_at(at, self._fire)
        self._timer_at = at

    def head(self, now: float) -> None:
        """A request head begins at `now`."""
        self.phase = HEAD
        self.deadline = deadline = now + self._head_timeout
        if self._timer is None or deadline < self._timer_at:  # later deadlines wait for the timer to fire
            self._arm(deadline)

    def body(self, now: float) -> None:
        """The head was complete, or a piece of the body arrived, at `now`: the next must come within the body timeout."""
        self.phase = BODY
        self.deadline = deadline = now + self._body_timeout
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)

    def idle(self) -> None:
        """The request is read; a timer still armed finds nothing to do and is not re-armed."""
        self.phase = IDLE

    def close(self) -> None:
        """The connection is gone: cancel the timer, and let go of the connection (`on_expired` refers
        to it: a cycle that would wait for the garbage collector)."""
        self.phase = IDLE
        self._on_expired = _gone
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._fire)
        self._timer_at = at

    def _fire(self) -> None:
        self._timer = None
        phase = self.phase
        if phase is IDLE:
            return
        now = self._loop.time()
        if now < self.deadline:
            self._arm(self.deadline)
        elif not self._on_expired(phase):
            (self.body if phase is BODY else self.head)(now)


def _gone(phase: Phase) -> bool:
    return True
