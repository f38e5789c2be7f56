"""The continuous-batching loop of one simulated server.

Admission: requests wait in FIFO order and join the running batch at the start of a step while the
batch is below `max_running_requests`, their KV reservation fits, and the step's prefill budget
(`max_prefill_tokens`, at least one request) allows. KV reservation rule: a request reserves
`prompt_tokens + max_new_tokens` when it is admitted and frees it when it leaves; there is no
retraction, so when the cache is full requests queue. A request that could never fit is refused
before it is queued (see `Engine.check_fits`).

A step that starts with B running requests takes `t0 + a*B` plus the prefill of the requests that
joined in it, times the time scale. When it ends, every request in it gains its tokens at once:
joiners their first token, decoders 1 (plain) or a seeded draw with mean tau (drafting). Steps are
scheduled on absolute deadlines of the shared `Timeline`; how late the loop delivered each step
against its modelled end is accumulated as the schedule slip, the simulator's own fidelity check.

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
from dataclasses import dataclass, field
from typing import Literal, Protocol

from backends.sim.profiles import RoleProfile
from backends.sim.steps import StepModel
from backends.sim.timeline import Timeline
from backends.sim.tokenizer import PseudoText

RequestState = Literal["waiting", "running", "finished", "aborted"]

# Steps averaged for gen_throughput and the acceptance length, like SGLang's logging window.
STATS_WINDOW_STEPS = 40


@dataclass(slots=True, eq=False)
class SimRequest:
    """One generation request as the engine sees it."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    is_streaming: bool
    text_start: int
    stop: tuple[str, ...] = ()
    natural_stop: int | None = None  # token id reported when reaching max_new_tokens is the model's EOS
    created: float = field(default_factory=time.time)
    state: RequestState = "waiting"
    produced: int = 0
    verify_steps: int = 0
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    text_limit: int | None = None  # output characters kept when a stop string matched
    arrived_at: float = 0.0
    first_token_at: float | None = None
    last_token_at: float = 0.0
    finished_at: float | None = None  # wall clock
    event: asyncio.Event = field(default_factory=asyncio.Event)
    _chars: int = 0
    _tail: str = ""

    @property
    def done(self) -> bool:
        """Finished or aborted."""
        return self.state == "finished" or self.state == "aborted"

    def record(self) -> dict[str, object]:
        """The request as listed by the test-only `/_test/requests` route."""
        return {
            "rid": self.rid,
            "state": self.state,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.produced,
            "created": self.created,
            "finished_at": self.finished_at,
            "finish_reason": self.finish_reason,
        }


class EngineObserver(Protocol):
    """Receives the timings the metrics are made of (`time.monotonic()` seconds)."""

    def first_token(self, req: SimRequest, at: float) -> None: ...

    def tokens(self, req: SimRequest, count: int, interval: float) -> None: ...

    def finished(self, req: SimRequest, at: float) -> None: ...


class RequestError(ValueError):
    """A request the server refuses (SGLang answers these with a 400)."""


@dataclass(slots=True)
class _StepRecord:
    start: float
    end: float
    tokens: int
    decode_tokens: int
    decoding: int


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
    """Continuous batching for one server role; see the module docstring for the model."""

    def __init__(
        self,
        table: RoleProfile,
        steps: StepModel,
        timeline: Timeline,
        text: PseudoText,
        *,
        time_scale: float,
        max_prefill_tokens: int,
        observer: EngineObserver | None = None,
        history_size: int = 20000,
    ) -> None:
        self.table = table
        self.steps = steps
        self.timeline = timeline
        self.text = text
        self.time_scale = time_scale
        self.max_prefill_tokens = max_prefill_tokens
        self.observer = observer
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[str, SimRequest] = {}
        self.live: dict[str, SimRequest] = {}
        self.history: deque[SimRequest] = deque(maxlen=history_size)
        self.kv_reserved = 0
        self.frozen = False
        self.num_aborted = 0
        self.num_steps = 0
        self.last_batch = 0
        self.slip_seconds = 0.0
        self.last_lag_seconds = 0.0
        self.prefill_tokens_total = 0
        self.prefill_busy_seconds = 0.0
        self._recent: deque[_StepRecord] = deque(maxlen=STATS_WINDOW_STEPS)
        self._wake = asyncio.Event()
        self._step_waiters: list[asyncio.Future[None]] = []

    # ----- requests in -----

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise `RequestError` if the request could never run here."""
        if prompt_tokens + max_new_tokens > self.table.max_total_tokens:
            raise RequestError(
                f"Requested token count exceeds the server's KV cache capacity of {self.table.max_total_tokens} "
                f"tokens. You requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )

    def submit(self, req: SimRequest, hold_seconds: float = 0.0) -> None:
        """Queue `req`; with `hold_seconds` it becomes eligible only after that much wall time."""
        if req.rid in self.live:
            raise RequestError(f"Duplicate request ID detected: {req.rid}")
        self.check_fits(req.prompt_tokens, req.max_new_tokens)
        req.arrived_at = time.monotonic()
        self.live[req.rid] = req
        if hold_seconds > 0:
            asyncio.get_running_loop().call_later(hold_seconds, self._enqueue, req)
        else:
            self._enqueue(req)

    def _enqueue(self, req: SimRequest) -> None:
        if req.state != "waiting":
            return  # aborted while held back
        self.waiting.append(req)
        self._wake.set()

    def find(self, rid: str) -> SimRequest | None:
        """A live request by id."""
        return self.live.get(rid)

    def abort(self, req: SimRequest) -> bool:
        """Take `req` out of the queue or batch at once and free its slot and KV; False if it had ended."""
        if req.done or self.live.get(req.rid) is not req:
            return False
        if req.state == "running":
            del self.running[req.rid]
            self.kv_reserved -= req.prompt_tokens + req.max_new_tokens
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass  # still held back by a slow_first_token fault
        self.num_aborted += 1
        self._close(req, "aborted", "abort", time.monotonic())
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
        if not self.has_work() and not self.frozen:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._step_waiters.append(waiter)
        await waiter

    # ----- state for metrics and load reports -----

    def has_work(self) -> bool:
        """Whether any request is queued or running."""
        return bool(self.running or self.waiting)

    def used_tokens(self) -> int:
        """KV tokens held by running requests: their prompts and what they generated so far."""
        return sum(r.prompt_tokens + r.produced for r in self.running.values())

    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens queued for prefill."""
        return sum(r.prompt_tokens for r in self.waiting)

    def gen_throughput(self) -> float:
        """Output tokens/s over the last steps, 0 when idle for a second."""
        if not self._recent:
            return 0.0
        first, last = self._recent[0], self._recent[-1]
        if time.monotonic() - last.end > 1.0:
            return 0.0
        span = last.end - first.start
        return sum(s.tokens for s in self._recent) / span if span > 0 else 0.0

    def accept_length(self) -> float:
        """Mean tokens per decoding request per step over the last steps (1.0 without drafting)."""
        decoding = sum(s.decoding for s in self._recent)
        if decoding == 0:
            return self.table.tokens_per_step(max(len(self.running), 1))
        return sum(s.decode_tokens for s in self._recent) / decoding

    def recent_requests(self) -> Iterator[SimRequest]:
        """Live requests, then ended ones newest first."""
        yield from self.live.values()
        yield from reversed(self.history)

    # ----- the step loop -----

    async def run(self) -> None:
        """Step forever; cancel the task to stop."""
        clock = time.monotonic
        ready_at = clock()
        while True:
            if self.frozen or not self.has_work():
                await self._wake.wait()
                self._wake.clear()
                ready_at = clock()
                continue
            async with self.timeline.lock:
                joined, prefill_tokens = self._admit()
                batch = len(self.running)
                if batch == 0:
                    continue
                decoding = batch - len(joined)
                duration = self.steps.duration_ms(batch, prefill_tokens) * self.time_scale / 1000.0
                start, end = self.timeline.reserve(ready_at, duration)
                await _sleep_until(end)
            lag = clock() - end
            self.last_lag_seconds = max(lag, 0.0)
            self.slip_seconds += self.last_lag_seconds
            self.num_steps += 1
            self.last_batch = batch
            self.prefill_tokens_total += prefill_tokens
            self.prefill_busy_seconds += self.table.prefill_ms_per_token * prefill_tokens / 1000.0
            self._emit(batch, decoding, start, end)
            ready_at = end

    def _admit(self) -> tuple[list[SimRequest], int]:
        joined: list[SimRequest] = []
        prefill = 0
        capacity = self.table.max_total_tokens
        while self.waiting and len(self.running) < self.table.max_running_requests:
            req = self.waiting[0]
            need = req.prompt_tokens + req.max_new_tokens
            if self.kv_reserved + need > capacity:
                break
            if joined and prefill + req.prompt_tokens > self.max_prefill_tokens:
                break
            self.waiting.popleft()
            self.kv_reserved += need
            req.state = "running"
            self.running[req.rid] = req
            joined.append(req)
            prefill += req.prompt_tokens
        return joined, prefill

    def _emit(self, batch: int, decoding: int, start: float, end: float) -> None:
        draws = self.steps.draw(batch, decoding)
        observer = self.observer
        tokens = decode_tokens = 0
        i = 0
        for req in list(self.running.values()):
            if req.produced == 0:
                gained = 1  # the joining step's prefill yields the first token
                req.first_token_at = end
                if observer is not None:
                    observer.first_token(req, end)
            else:
                gained = draws[i] if draws is not None else 1
                i += 1
                req.verify_steps += 1
                if observer is not None:
                    observer.tokens(req, gained, end - req.last_token_at)
            gained = min(gained, req.max_new_tokens - req.produced)
            if req.produced:
                decode_tokens += gained
            req.produced += gained
            req.last_token_at = end
            tokens += gained
            if req.stop and self._hit_stop(req, gained):
                self._leave(req, "stop", end)
            elif req.produced >= req.max_new_tokens:
                if req.natural_stop is not None:
                    req.matched_stop = req.natural_stop
                    self._leave(req, "stop", end)
                else:
                    self._leave(req, "length", end)
            elif req.is_streaming:
                req.event.set()
        self._recent.append(_StepRecord(start, end, tokens, decode_tokens, decoding))
        waiters, self._step_waiters = self._step_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _hit_stop(self, req: SimRequest, gained: int) -> bool:
        new = self.text.text(req.text_start, req.produced - gained, gained)
        window = req._tail + new
        hits = [(pos, stop) for stop in req.stop if (pos := window.find(stop)) >= 0]
        if hits:
            pos, stop = min(hits)
            req.text_limit = req._chars - len(req._tail) + pos
            req.matched_stop = stop
            return True
        req._chars += len(new)
        keep = max(len(s) for s in req.stop) - 1
        req._tail = window[-keep:] if keep else ""
        return False

    def _leave(self, req: SimRequest, reason: str, at: float) -> None:
        del self.running[req.rid]
        self.kv_reserved -= req.prompt_tokens + req.max_new_tokens
        self._close(req, "finished", reason, at)

    def _close(self, req: SimRequest, state: RequestState, reason: str, at: float) -> None:
        req.state = state
        req.finish_reason = reason
        req.finished_at = time.time()
        del self.live[req.rid]
        self.history.append(req)
        if self.observer is not None:
            self.observer.finished(req, at)
        req.event.set()
