"""One simulated server in real time: drives its `EngineCore` on the wall clock and tells the HTTP layer.

The core decides what runs (see `backends.sim.core`); this loop books each step on the shared
`Timeline` for the core's modelled duration times the time scale, sleeps until its end, then lets
the core apply the step and wakes the responses whose requests gained tokens or ended (and, on a
drafting server, first wakes its joiners at their first token, within the step). Steps run
on absolute deadlines; how late the loop delivered each step against its modelled end is
accumulated as the schedule slip, the simulator's own fidelity check. It also keeps what is not the
scheduler's: request ids in use, recently ended requests, faults (held-back requests, a frozen GPU).

Times are read from `time.monotonic()`, not the event loop's clock: uvloop's clock (like its timers)
has millisecond resolution and is only read once per loop pass, too coarse for sub-millisecond
steps at small time scales. See `_sleep_until` for how steps are timed despite that. A step may be
delivered up to half a millisecond early; the next step starts at the modelled end regardless, so
the timeline never drifts.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator

from backends.sim.core import EngineCore
from backends.sim.request import RequestError, SimRequest
from backends.sim.timeline import Timeline

# A step this close to its end is delivered rather than slept for: timers round to milliseconds.
_EARLY_TOLERANCE_S = 0.0005


async def _sleep_until(end: float) -> None:
    """Sleep until `time.monotonic()` reaches `end` (give or take the tolerance).

    libuv (under uvloop) computes how long to wait for the next timer from a clock it reads at the
    start of each loop pass; a pass that runs the previous step's burst of stream writes (5 ms for
    256 streams) would make that wait, and so every step, late by the burst. Yielding once first
    lets the burst run before the timer is armed, and a timer that fires early is slept again.
    """
    await asyncio.sleep(0)
    while (remaining := end - time.monotonic()) > _EARLY_TOLERANCE_S:
        await asyncio.sleep(remaining)


class Engine:
    """The real-time driver of one server's core; see the module docstring."""

    def __init__(self, core: EngineCore, timeline: Timeline, *, time_scale: float, history_size: int = 20000) -> None:
        self.core = core
        self.text = core.text
        self.timeline = timeline
        self.time_scale = time_scale
        self.live: dict[str, SimRequest] = {}
        self.history: deque[SimRequest] = deque(maxlen=history_size)
        self.frozen = False
        self.slip_seconds = 0.0
        self.last_lag_seconds = 0.0
        self._wake = asyncio.Event()
        self._step_waiters: list[asyncio.Future[None]] = []

    # ----- requests in -----

    def submit(self, req: SimRequest, hold_seconds: float = 0.0) -> None:
        """Queue `req`; with `hold_seconds` it becomes eligible only after that much wall time."""
        if req.rid in self.live:
            raise RequestError(f"Duplicate request ID detected: {req.rid}")
        self.core.check_fits(req.prompt_tokens, req.max_new_tokens)
        req.arrived_at = time.monotonic()
        self.live[req.rid] = req
        if hold_seconds > 0:
            asyncio.get_running_loop().call_later(hold_seconds, self._enqueue, req)
        else:
            self._enqueue(req)

    def _enqueue(self, req: SimRequest) -> None:
        if req.state != "waiting":
            return  # aborted while held back
        self.core.enqueue(req)
        self._wake.set()

    def find(self, rid: str) -> SimRequest | None:
        """A live request by id."""
        return self.live.get(rid)

    def abort(self, req: SimRequest) -> bool:
        """Take `req` out of the queue or batch at once and free its slot and KV; False if it had ended."""
        if self.live.get(req.rid) is not req or not self.core.abort(req, time.monotonic()):
            return False
        self._retire(req)
        return True

    def abort_all(self) -> int:
        """Abort every live request; how many."""
        return sum(self.abort(req) for req in list(self.live.values()))

    def freeze(self) -> None:
        """Stop stepping (a hung GPU): running requests stall until `thaw`."""
        self.frozen = True

    def thaw(self) -> None:
        """Resume stepping after `freeze`; the timeline restarts from now, without catching up."""
        self.frozen = False
        self._wake.set()

    async def next_step(self) -> None:
        """Return after the next step ends, or at once when there is nothing to step (a health probe)."""
        if not self.core.has_work() and not self.frozen:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._step_waiters.append(waiter)
        await waiter

    async def flush_cache(self, timeout: float) -> bool:
        """SGLang's `/flush_cache?timeout=`: wait up to `timeout` wall seconds for no request to wait or run,
        then empty the prefix cache; False (not flushed) if requests are still there."""
        deadline = time.monotonic() + timeout
        while self.core.has_work() and (remaining := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self.next_step(), remaining)
            except TimeoutError:
                break
        return self.core.flush_cache()

    def recent_requests(self) -> Iterator[SimRequest]:
        """Live requests, then ended ones newest first."""
        yield from self.live.values()
        yield from reversed(self.history)

    # ----- the step loop -----

    async def run(self) -> None:
        """Step forever; cancel the task to stop."""
        clock = time.monotonic
        core = self.core
        ready_at = clock()
        while True:
            if self.frozen or not core.has_work():
                await self._wake.wait()
                self._wake.clear()
                ready_at = clock()
                continue
            async with self.timeline.lock:
                plan = core.plan_step()
                if plan is None:
                    continue
                start, end = self.timeline.reserve(ready_at, plan.duration_ms * self.time_scale / 1000.0)
                if plan.early_first_token:
                    first = start + plan.first_token_ms * self.time_scale / 1000.0
                    await _sleep_until(first)
                    self._notify(core.first_tokens(plan, first))
                await _sleep_until(end)
            self.last_lag_seconds = max(clock() - end, 0.0)
            self.slip_seconds += self.last_lag_seconds
            self._notify(core.finish_step(plan, start, end))
            waiters, self._step_waiters = self._step_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            ready_at = end

    def _notify(self, changed: list[SimRequest]) -> None:
        """Wake the responses of requests that gained tokens; retire those that ended."""
        for req in changed:
            if req.done:
                self._retire(req)
            elif req.is_streaming:
                req.event.set()

    def _retire(self, req: SimRequest) -> None:
        """A request the core ended: out of the live ids, into the history, its response woken."""
        req.finished_at = time.time()
        del self.live[req.rid]
        self.history.append(req)
        req.event.set()
