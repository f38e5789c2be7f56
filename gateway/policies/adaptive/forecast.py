"""The load the node is about to carry over one request's life, and the load it has been carrying.

A routing decision holds for a request's whole life, so a group's mode must suit the load over that life. A
request decodes beside the load arrivals meet: each arrival's in-flight count, itself included, averaged over
the arrivals of the last life (the forecast) and of the last few (`settled`), reaching back to the last
`MET_ARRIVALS` within `_KEEP_LIVES` lives at light load. Under open loop that is one more than the
time-averaged in-flight count (an arrival meets the average and adds itself); a closed loop's arrivals meet
its concurrency. The forecast is the larger of that mean and what is there now (in flight and this request)
plus the rise of the in-flight count over the last quarter life carried half a life ahead: a step up in
open-loop load is seen after a handful of arrivals. A burst is one event, not a rate that goes on (a closed
loop starting, or replacing its completions in waves), so it is left out of the rise; the gateway reads it one
request at a time, over a millisecond or so: arrivals closer than a small share of the mean gap came in one
burst. One finding the node idle under light traffic meets only those joining it (`joining`); light traffic's
rate is the gateway's routings a second (`light_rate`). The life is the EWMA of finished requests'
arrival-to-last-token times; until one, only what is there now counts.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

LIFE_RATE = 0.1  # weight of each finished request in the mean life
RISE_WINDOW = 0.25  # lives over which the in-flight count's rise is read...
RISE_AHEAD = 0.5  # ... and the lives ahead it is carried (to the middle of the new request's life)
SETTLED_LIVES = 4.0  # the settled load is the mean over the arrivals of this many lives
MET_ARRIVALS = 8  # a span's mean reaches back to at least this many arrivals ...
_KEEP_LIVES = 2 * SETTLED_LIVES  # ... of this many lives at most; older ones are dropped (the life may still grow)
# An arrival within this share of the mean gap between the arrivals kept (reckoned at MET_ARRIVALS a life
# at least) of the one before came in the same burst: a 32nd of the mean gap catches 3% of Poisson gaps.
INSTANT_SHARE = 1.0 / 32.0
# The light traffic's rate is read over this many arrivals at most.
RATE_ARRIVALS = 32
# Traffic is light where at least this share of the last MET_ARRIVALS arrivals found the node idle.
IDLE_SHARE = 0.5


class LoadForecast:
    """At each routing: the pool's clock and the load the request met (in flight and itself), and whether
    it came in a burst, over the last few lives; the mean life."""

    def __init__(self) -> None:
        self.life = 0.0  # seconds; 0 until a request finished
        self._times: list[float] = []  # routing times, in order
        self._met: list[float] = [0.0]  # running sum of the loads the arrivals met (one entry ahead of `_times`)
        self._idle: list[int] = [0]  # running count of the arrivals that found the node idle (alike)
        self._decisions: list[int] = []  # the gateway's count of routings at each of `_times` (every worker's)
        self._first = 0  # index of the oldest kept
        self._routed: deque[tuple[float, int, bool]] = deque()  # (time, in flight with it, in a burst)
        self._batched = 0  # how many of those came in a burst

    def arrived(self, at: float, inflight: int, decisions: int) -> None:
        """A request was routed at `at` (the pool's clock) with `inflight` already in flight, the whole
        gateway's `decisions`-th routing (every worker's counted)."""
        batch = self._first < len(self._times) and at - self._times[-1] <= self._instant()
        self._times.append(at)
        self._decisions.append(decisions)
        self._met.append(self._met[-1] + inflight + 1)
        self._idle.append(self._idle[-1] + (inflight == 0))
        self._routed.append((at, inflight + 1, batch))
        self._batched += batch
        if self.life > 0.0:
            self._first = bisect.bisect_left(self._times, at - _KEEP_LIVES * self.life, lo=self._first)
            if self._first > 1024 and self._first * 2 > len(self._times):
                del self._times[: self._first], self._met[: self._first], self._idle[: self._first], self._decisions[: self._first]
                self._first = 0
            horizon = at - RISE_WINDOW * self.life
            while self._routed and self._routed[0][0] < horizon:
                self._batched -= self._routed.popleft()[2]

    def finished(self, seconds: float) -> None:
        """A request's life (arrival to last token) was `seconds`."""
        if seconds > 0.0:
            self.life = seconds if self.life == 0.0 else self.life + LIFE_RATE * (seconds - self.life)

    def load(self, at: float, inflight: int) -> float:
        """Requests expected in flight over a life from `at`, the one being routed among them, with
        `inflight` in flight now."""
        now = float(inflight + 1)
        if self.life == 0.0:
            return now
        return max(self._mean(at, self.life), now + self._rise(inflight) * RISE_AHEAD / RISE_WINDOW)

    def arriving(self, at: float, inflight: int) -> float:
        """Requests arriving over a life from `at` that a request routed now meets, averaged over its life:
        half the mean count an arrival of the last life found in flight (an open loop's mean in-flight
        count, a closed loop's concurrency less one: as many arrive over a life, each there from its
        arrival on), plus the rise the in-flight count is on; infinite before any request finished."""
        if self.life == 0.0:
            return math.inf
        return max(self._mean(at, self.life) - 1.0, 0.0) / 2.0 + self._rise(inflight) * RISE_AHEAD / RISE_WINDOW

    def settled(self, at: float, inflight: int) -> float:
        """The mean load over the arrivals of the last `SETTLED_LIVES` lives, or what is there now if more:
        slow to fall, so a lull or an idle gap between bursts does not read as light traffic."""
        now = float(inflight + 1)
        if self.life == 0.0:
            return now
        return max(self._mean(at, SETTLED_LIVES * self.life), now)

    def joining(self) -> float | None:
        """Requests expected beside one that arrives now to find the node idle, averaged over its life:
        half as many as arrive in a life, which is as many as the last `MET_ARRIVALS` arrivals found in
        flight on average (Little; read from the node's counts, so alike with one worker or several),
        each there from its arrival on. None unless traffic is light: at least `IDLE_SHARE` of those
        arrivals found the node idle (amid heavier traffic an idle moment is a lull, a closed loop
        refilling or the gap before a burst, and says nothing of what joins)."""
        if self.life == 0.0 or len(self._times) < MET_ARRIVALS:
            return None
        if self._idle[-1] - self._idle[-1 - MET_ARRIVALS] < IDLE_SHARE * MET_ARRIVALS:
            return None
        found = (self._met[-1] - self._met[-1 - MET_ARRIVALS]) / MET_ARRIVALS - 1.0
        return found / 2.0

    def light_rate(self) -> float | None:
        """Under light traffic (`joining`'s test), the whole gateway's arrivals a second over its last
        `RATE_ARRIVALS` or more, however old (more than the test reads: a window the test found light is
        one whose arrivals came slowly); None otherwise, or while those came at one instant."""
        if self.joining() is None:
            return None
        counts, times = self._decisions, self._times
        start = max(bisect.bisect_right(counts, counts[-1] - RATE_ARRIVALS) - 1, 0)
        span = times[-1] - times[start]
        return (counts[-1] - counts[start]) / span if span > 0.0 else None

    def in_burst(self, at: float) -> bool:
        """Whether a request routed at `at` comes in one burst with the one routed before it (`_instant`)."""
        return self._first < len(self._times) and at - self._times[-1] <= self._instant()

    def quiet(self, at: float) -> float:
        """How long it has been at `at` since the latest arrival, in mean gaps between the last
        `MET_ARRIVALS` arrivals (infinite after arrivals of one instant); 0 before that many."""
        times = self._times
        if len(times) - self._first <= MET_ARRIVALS:
            return 0.0
        gap = (times[-1] - times[-1 - MET_ARRIVALS]) / MET_ARRIVALS
        return (at - times[-1]) / gap if gap > 0.0 else math.inf

    def _rise(self, inflight: int) -> int:
        """How far the in-flight count rose over the routings kept, those of the last quarter life as of
        the latest (`arrived` trims them), less the arrivals that came in bursts."""
        return max(inflight - self._routed[0][1] - self._batched, 0) if self._routed else 0

    def _instant(self) -> float:
        """How close together two arrivals of one burst come: `INSTANT_SHARE` of the mean gap between the
        arrivals kept, the gap no longer than a life over `MET_ARRIVALS` (a few arrivals after a quiet
        spell say little of the rate); 0 (equal times only) before any request finished."""
        per_life = max((len(self._times) - self._first) / _KEEP_LIVES, MET_ARRIVALS)
        return INSTANT_SHARE * self.life / per_life

    def _mean(self, at: float, span: float) -> float:
        """The mean load met by the arrivals of the `span` seconds before `at`, or by the last `MET_ARRIVALS`
        of the last `_KEEP_LIVES` lives if the span holds fewer (0 without any)."""
        times = self._times
        oldest = bisect.bisect_left(times, at - _KEEP_LIVES * self.life, lo=self._first)
        start = max(min(bisect.bisect_left(times, at - span, lo=oldest), len(times) - MET_ARRIVALS), oldest)
        count = len(times) - start
        return (self._met[-1] - self._met[start]) / count if count else 0.0
