"""The load the node is about to carry over one request's life, and the load it has been carrying.

A routing decision holds for a request's whole life, so a group's mode must suit the load over that
life, not the instant of arrival. Loads are mean in-flight counts read from the pool's load integral
(exact, completions included, whatever the lengths): over the last life, and over the last few
(`settled`). The forecast for the next life is the larger of the mean over the last life and what is
there now (in flight, waiting to be routed, and this request) plus the rise of the in-flight count
over the last quarter life carried half a life ahead: a step up in open-loop load is seen after a
handful of arrivals. Arrivals that came in one batch (at one instant, or while others waited to be
routed) are left out of the rise: the waiting count already holds a batch whole, and a closed loop's
arrivals, which replace its completions in waves, show no rise. The life is the EWMA of finished
requests' time from arrival to last token; before the first, only what is there now is known.
"""

from __future__ import annotations

import bisect
from collections import deque

LIFE_RATE = 0.1  # weight of each finished request in the mean life
RISE_WINDOW = 0.25  # lives over which the in-flight count's rise is read...
RISE_AHEAD = 0.5  # ... and the lives ahead it is carried (to the middle of the new request's life)
SETTLED_LIVES = 4.0  # the settled load is the mean in flight over this many lives
_KEEP_LIVES = 2 * SETTLED_LIVES  # samples older than this many lives are dropped (the life may still grow)


class LoadForecast:
    """At each routing: the pool's clock, load integral and in-flight count, and whether the request
    came in a batch, over the last few lives; the mean life."""

    def __init__(self) -> None:
        self.life = 0.0  # seconds; 0 until a request finished
        self._times: list[float] = []  # routing times, in order
        self._areas: list[float] = []  # the load integral at each
        self._first = 0  # index of the oldest kept
        self._routed: deque[tuple[float, int, bool]] = deque()  # (time, in flight with it, in a batch)
        self._batched = 0  # how many of those came in a batch

    def arrived(self, at: float, area: float, inflight: int, pending: int) -> None:
        """A request was routed at `at` (the pool's clock, load integral `area`), `inflight` already in
        flight, `pending` more waiting."""
        batch = pending > 0 or (self._first < len(self._times) and self._times[-1] == at)
        self._times.append(at)
        self._areas.append(area)
        self._routed.append((at, inflight + 1, batch))
        self._batched += batch
        if self.life > 0.0:
            self._first = bisect.bisect_left(self._times, at - _KEEP_LIVES * self.life, lo=self._first)
            if self._first > 1024 and self._first * 2 > len(self._times):
                del self._times[: self._first], self._areas[: self._first]
                self._first = 0
            horizon = at - RISE_WINDOW * self.life
            while self._routed and self._routed[0][0] < horizon:
                self._batched -= self._routed.popleft()[2]

    def finished(self, seconds: float) -> None:
        """A request's life (arrival to last token) was `seconds`."""
        if seconds > 0.0:
            self.life = seconds if self.life == 0.0 else self.life + LIFE_RATE * (seconds - self.life)

    def load(self, at: float, area: float, inflight: int, pending: int) -> float:
        """Requests expected in flight over a life from `at` (load integral `area`), the one being routed
        among them, with `inflight` in flight now and `pending` more waiting to be routed."""
        now = float(inflight + pending + 1)
        if self.life == 0.0:
            return now
        # The routings kept are those of the last quarter life as of the latest (`arrived` trims them).
        rise = max(inflight - self._routed[0][1] - self._batched, 0) if self._routed else 0
        return max(self._mean(at, area, self.life), now + rise * RISE_AHEAD / RISE_WINDOW)

    def settled(self, at: float, area: float, inflight: int, pending: int) -> float:
        """The mean load over the last `SETTLED_LIVES` lives, or what is there now if more: slow to fall,
        so a lull or an idle gap between bursts does not read as light traffic."""
        now = float(inflight + pending + 1)
        if self.life == 0.0:
            return now
        return max(self._mean(at, area, SETTLED_LIVES * self.life), now)

    def _mean(self, at: float, area: float, span: float) -> float:
        """The mean in-flight count over the `span` seconds before `at` (over what is known of it): the
        integral at the window's start interpolated between the routings around it, `at` itself the last."""
        start = at - span
        i = bisect.bisect_left(self._times, start, lo=self._first)
        if i == self._first:  # the window reaches past the oldest routing kept: average from that one
            if i == len(self._times) or self._times[i] >= at:
                return 0.0
            since, start_area = self._times[i], self._areas[i]
        else:
            t0, a0 = self._times[i - 1], self._areas[i - 1]
            t1, a1 = (self._times[i], self._areas[i]) if i < len(self._times) else (at, area)
            since = start
            start_area = a0 + (a1 - a0) * (start - t0) / (t1 - t0) if t1 > t0 else a1
        return (area - start_area) / (at - since)
