"""New requests start a few per turn of the event loop, so a burst of them cannot stall the streams in flight.

A stream's chunks are relayed in its upstream socket's read callback, which runs when the loop polls
for I/O; a new request's work (parse, route, encode, connect, send) runs in its task, and the loop
runs every ready task before it polls again, so hundreds of streams opened at once were one long
turn of the loop during which no chunk of the streams already running was relayed. `TurnPacer` lets
`per_turn` requests start per turn and queues the rest, first come first served. With no stream in
flight there is nothing to hold up and every request starts at once. Measured:
docs/benchmarks/design-notes.md#pacing.
"""

from __future__ import annotations

import asyncio
from collections import deque


class TurnPacer:
    """While streams are in flight, at most `per_turn` requests start per turn of the running loop; the
    others wait their turn in order."""

    __slots__ = ("_per_turn", "_started", "_waiting", "_turn_ends", "streams")

    def __init__(self, per_turn: int) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self._per_turn = per_turn
        self._started = 0  # requests started in this turn
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._turn_ends = False  # `_next_turn` is scheduled
        self.streams = 0  # streams being relayed (the proxy counts them): what a burst would hold up

    @property
    def waiting(self) -> int:
        """Requests queued for a later turn."""
        return len(self._waiting)

    def turn(self) -> asyncio.Future[None] | None:
        """None: start now; else a future to await, done when this request's turn comes.

        A request that stops waiting (cancelled) gives its place to the next one.
        """
        if not self.streams and not self._waiting:
            return None
        if not self._turn_ends:
            self._turn_ends = True
            asyncio.get_running_loop().call_soon(self._next_turn)  # runs after the loop's next poll for I/O
        if self._started < self._per_turn and not self._waiting:
            self._started += 1
            return None
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        return waiter

    def _next_turn(self) -> None:
        self._started = 0
        waiting = self._waiting
        while waiting and self._started < self._per_turn:
            waiter = waiting.popleft()
            if not waiter.done():  # a cancelled waiter's request is gone
                waiter.set_result(None)
                self._started += 1
        self._turn_ends = bool(waiting) or self._started > 0
        if self._turn_ends:
            asyncio.get_running_loop().call_soon(self._next_turn)
