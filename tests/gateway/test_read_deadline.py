"""A connection's read deadline on a clock the test moves: one timer per connection, re-armed lazily."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import cast

from gateway.edge.read_deadline import BODY, FRESH, HEAD, Phase, ReadDeadline

HEAD_S, BODY_S = 10.0, 4.0  # the timeouts


class Timer:
    def __init__(self, at: float, callback: Callable[[], None]) -> None:
        self.at = at
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None


class Clock:
    """The part of an event loop a deadline uses, with time moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(at, callback)
        self.timers.append(timer)
        return timer

    @property
    def armed(self) -> int:
        """Timers ever armed."""
        return len(self.timers)

    @property
    def pending(self) -> list[Timer]:
        return [t for t in self.timers if t.callback is not None]

    def advance(self, seconds: float) -> None:
        """Move the clock, firing each timer due on the way, in order."""
        end = self.now + seconds
        while due := sorted((t for t in self.pending if t.at <= end), key=lambda t: t.at):
            timer = due[0]
            self.now = max(self.now, timer.at)
            callback, timer.callback = timer.callback, None
            assert callback is not None
            callback()
        self.now = end


def deadline(clock: Clock, answer: bool = True) -> tuple[ReadDeadline, list[tuple[float, Phase]]]:
    """A deadline on `clock` whose expiries are recorded; `answer`: what the connection says to one."""
    expired: list[tuple[float, Phase]] = []

    def on_expired(phase: Phase) -> bool:
        expired.append((clock.now, phase))
        return answer

    return ReadDeadline(cast(asyncio.AbstractEventLoop, clock), HEAD_S, BODY_S, on_expired), expired


def test_a_connection_that_sends_nothing_expires_a_head_timeout_after_its_accept() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    clock.advance(HEAD_S - 0.01)
    assert expired == []
    clock.advance(0.02)
    assert expired == [(HEAD_S, FRESH)]


def test_a_head_counts_from_its_first_byte_and_reads_do_not_extend_it() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    clock.advance(3.0)
    d.head(clock.now)  # the first byte; the protocol leaves the deadline alone on each read after it
    clock.advance(9.0)  # a byte a second, as slowloris sends
    assert expired == []
    clock.advance(1.5)
    assert expired == [(3.0 + HEAD_S, HEAD)]


def test_a_body_may_take_any_time_while_no_gap_between_reads_passes_its_timeout() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    d.head(clock.now)
    d.body(clock.now)  # the head is complete
    for _ in range(1000):
        clock.advance(BODY_S * 0.9)
        d.body(clock.now)
    assert expired == []
    clock.advance(BODY_S + 0.01)
    assert expired == [(clock.now - 0.01, BODY)]


def test_reads_only_move_the_deadline_one_timer_fires_per_timeout_at_most() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    d.head(clock.now)
    d.body(clock.now)
    before = clock.armed
    for _ in range(10_000):  # reads in quick succession: no timer each
        clock.advance(0.0001)
        d.body(clock.now)
    assert clock.armed == before
    assert len(clock.pending) == 1


def test_a_kept_alive_connection_arms_no_timer_per_request() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    for _ in range(10_000):  # a request every millisecond on one connection: head, body, then idle
        clock.advance(0.001)
        d.head(clock.now)
        d.body(clock.now)
        d.idle()
    # About 10,000 requests in 10 s: a timer (or two: a body's deadline is earlier than a head's) per 4 s.
    assert clock.armed <= 2 * (1 + clock.now / min(HEAD_S, BODY_S))
    assert expired == []


def test_an_idle_connection_is_not_ended_by_its_clock() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    d.head(clock.now)
    d.body(clock.now)
    d.idle()  # the request is read: the response, then uvicorn's keep-alive timer, govern
    clock.advance(1000.0)
    assert expired == [] and clock.pending == []


def test_a_wait_that_is_the_servers_restarts_the_full_timeout() -> None:
    clock = Clock()
    d, expired = deadline(clock, answer=False)
    d.head(clock.now)
    d.body(clock.now)
    clock.advance(BODY_S + 0.5)
    assert expired == [(BODY_S, BODY)]
    clock.advance(BODY_S)
    assert expired == [(BODY_S, BODY), (2 * BODY_S, BODY)]


def test_a_shorter_timeout_after_a_longer_one_is_kept_on_time() -> None:
    clock = Clock()
    d, expired = deadline(clock)
    d.head(clock.now)
    d.body(clock.now)
    d.idle()
    clock.advance(1.0)
    d.head(clock.now)  # a head (10 s) after a body (4 s) is later; then a body after a head armed for 10 s is earlier
    d.body(clock.now)
    clock.advance(BODY_S + 0.01)
    assert expired == [(1.0 + BODY_S, BODY)]


class Connection:
    def expired(self, phase: Phase) -> bool:
        raise AssertionError("a closed connection's deadline fired")


def test_close_cancels_the_timer_and_lets_go_of_the_connection() -> None:
    clock = Clock()
    conn = Connection()
    alive = weakref.ref(conn)
    d = ReadDeadline(cast(asyncio.AbstractEventLoop, clock), HEAD_S, BODY_S, conn.expired)
    d.head(clock.now)
    d.close()
    assert clock.pending == []
    clock.advance(HEAD_S * 2)
    del conn
    assert alive() is None  # freed by reference counting: the deadline no longer refers to it
