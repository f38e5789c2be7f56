"""The clock-free core of one simulated server: admission, continuous batching and what each step yields.

Nothing here reads a clock or awaits: times are arguments, so the real-time `Engine` and a
virtual-time model drive the same class step by step (co-located servers: one core each, their
steps serialized on the caller's timeline). A step is `plan_step()`, then `first_tokens(plan, at)` when
`plan.early_first_token`, then `finish_step(plan, start, end)`.

Admission, at the start of a step, in FIFO order: a request joins while the batch is below
`max_running_requests`, the step's uncached prompt tokens stay within `max_prefill_tokens` (at least
one request joins), and its KV fits (`KVCache.admit`: uncached prompt plus `max_new_tokens`, reserved
until it leaves; no retraction). It reuses the longest cached prefix of its prompt, at most all but
the last token (SGLang's `_compute_max_prefix_len`). A step with B running requests takes the role's
step time at B plus `prefill_ms_per_token` times its joiners' uncached tokens (ms, time scale 1).
At its end decoders gain 1 token or a seeded draw with mean tau, and joiners their first token; on
a drafting server joiners have it sooner, after their prefill and one step of the target model
(`StepModel.first_token_ms`): the driver calls `first_tokens(plan, at)` then, and the joiners do not
decode in that step. A request that ends puts its tokens in the prefix cache. A request that could
never fit is refused up front.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from backends.sim.kvcache import Hold, KVCache
from backends.sim.profiles import RoleProfile
from backends.sim.request import RequestError, RequestState, SimRequest, max_req_input_len
from backends.sim.steps import StepModel
from backends.sim.tokenizer import PseudoText

# Steps averaged for gen_throughput and the acceptance length, like SGLang's logging window.
STATS_WINDOW_STEPS = 40
# SGLang's --decode-log-interval: its decode log, every that many decode steps, zeroes cache_hit_rate.
DECODE_LOG_INTERVAL = 40


class EngineObserver(Protocol):
    """Receives the timings the metrics are made of (the driver's clock, seconds)."""

    def first_token(self, req: SimRequest, at: float) -> None: ...

    def tokens(self, req: SimRequest, count: int, interval: float) -> None: ...

    def finished(self, req: SimRequest, at: float) -> None: ...


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step as admitted: its batch, its joiners and its modelled duration."""

    batch: int  # running requests, joiners included
    joined: tuple[SimRequest, ...]
    prefill_tokens: int  # the joiners' uncached prompt tokens
    cached_tokens: int  # the joiners' prompt tokens served from the prefix cache
    duration_ms: float  # modelled, at time scale 1
    first_token_ms: float  # when, from its start, the joiners have their first token (at most duration_ms)

    @property
    def early_first_token(self) -> bool:
        """Whether the joiners' first token comes before the step's end (`EngineCore.first_tokens`)."""
        return bool(self.joined) and self.first_token_ms < self.duration_ms

    @property
    def decoding(self) -> int:
        """Requests past their first token."""
        return self.batch - len(self.joined)


@dataclass(slots=True)
class _StepRecord:
    start: float
    end: float
    tokens: int
    decode_tokens: int
    decoding: int


class EngineCore:
    """Continuous batching for one server role; see the module docstring for the model."""

    def __init__(
        self,
        table: RoleProfile,
        steps: StepModel,
        text: PseudoText,
        *,
        max_prefill_tokens: int,
        radix_cache: bool = True,
        observer: EngineObserver | None = None,
        context_length: int | None = None,
    ) -> None:
        """`context_length`: the model's (None: no tighter than the KV cache), for SGLang's input limit."""
        self.context_length = context_length
        self.table = table
        self.steps = steps
        self.text = text
        self.max_prefill_tokens = max_prefill_tokens
        self.observer = observer
        self.kv = KVCache(table.max_total_tokens, enabled=radix_cache, bigram_keys=table.speculative)
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[str, SimRequest] = {}
        self._holds: dict[str, Hold] = {}
        self.num_steps = 0
        self.last_batch = 0
        self.num_aborted = 0
        self.prefill_tokens_total = 0  # uncached prompt tokens prefilled
        self.prefill_busy_seconds = 0.0  # their modelled prefill time, time scale 1
        self.cache_hit_rate = 0.0  # SGLang's gauge: the last prefill's cached share, zeroed by the decode log
        # SGLang's decode step-time moment sums: steps, batch, step microseconds, batch squared, batch
        # times step, tokens generated. A step is timed from the previous one's start (SGLang's launch
        # cadence: a co-located server's steps in between count) when both decoded alone.
        self.decode_moments = [0.0] * 6
        self._decode_start: float | None = None  # the last step's start, if it decoded alone
        self._decode_steps = 0
        self._recent: deque[_StepRecord] = deque(maxlen=STATS_WINDOW_STEPS)

    # ----- requests in and out -----

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise `RequestError` if the request could never run here: an input SGLang's scheduler refuses
        (its message), or one whose output the KV cache could not hold besides (the simulator's own
        refusal: SGLang would admit it and retract it when the cache runs out, which is not modelled)."""
        capacity = self.table.max_total_tokens
        limit = max_req_input_len(self.context_length or capacity, capacity)
        if prompt_tokens >= limit:
            raise RequestError(
                f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
        if prompt_tokens + max_new_tokens > capacity:
            raise RequestError(
                f"Requested token count exceeds the server's KV cache capacity of {capacity} "
                f"tokens. You requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )

    def enqueue(self, req: SimRequest) -> None:
        """Queue `req` (already checked with `check_fits`) behind the waiting requests."""
        self.waiting.append(req)

    def abort(self, req: SimRequest, now: float) -> bool:
        """Take `req` out of the queue or the batch at `now`, freeing its slot and KV; False if it had ended.

        A running request's KV goes into the prefix cache as a finished one's does.
        """
        if req.done:
            return False
        if req.state == "running":
            del self.running[req.rid]
            self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.num_aborted += 1
        self._close(req, "aborted", "abort", now)
        return True

    def flush_cache(self) -> bool:
        """Empty the prefix cache, as SGLang's `/flush_cache`: refused (False) while requests wait or run."""
        if self.has_work():
            return False
        self.kv.flush()
        self._decode_steps = 0  # SGLang's flush resets its decode counter with its other metrics
        return True

    # ----- the step -----

    def has_work(self) -> bool:
        """Whether any request is queued or running."""
        return bool(self.running or self.waiting)

    def plan_step(self) -> StepPlan | None:
        """Admit what may join and size the next step; None when nothing would run."""
        joined: list[SimRequest] = []
        prefill = cached = 0
        kv = self.kv
        while self.waiting and len(self.running) < self.table.max_running_requests:
            req = self.waiting[0]
            match = kv.match(req.prompt_ids, _prefix_limit(req))
            uncached = req.prompt_tokens - match.length
            if joined and prefill + uncached > self.max_prefill_tokens:
                break
            hold = kv.admit(match, req.prompt_tokens, req.max_new_tokens)
            if hold is None:
                break
            self.waiting.popleft()
            req.state = "running"
            req.cached_tokens = match.length
            self.running[req.rid] = req
            self._holds[req.rid] = hold
            joined.append(req)
            prefill += uncached
            cached += match.length
        batch = len(self.running)
        if batch == 0:
            return None
        steps = self.steps
        return StepPlan(
            batch, tuple(joined), prefill, cached, steps.duration_ms(batch, prefill), steps.first_token_ms(batch, prefill)
        )

    def first_tokens(self, plan: StepPlan, at: float) -> list[SimRequest]:
        """Give `plan`'s joiners their first token at `at`, before the step ends (`plan.early_first_token`);
        returns them, those it ended included. They gain nothing more in this step."""
        changed: list[SimRequest] = []
        for req in plan.joined:
            if self.running.get(req.rid) is req:  # not aborted since the step began
                self._first_token(req, at)
                changed.append(req)
        return changed

    def finish_step(self, plan: StepPlan, start: float, end: float) -> list[SimRequest]:
        """End `plan`'s step at `end`: every running request gains its tokens; returns them, finished ones included.

        Joiners gain their first token here unless `first_tokens` gave it to them already."""
        self.num_steps += 1
        self.last_batch = plan.batch
        self.prefill_tokens_total += plan.prefill_tokens
        self.prefill_busy_seconds += self.table.prefill_ms_per_token * plan.prefill_tokens / 1000.0
        self._log_cache_hits(plan)
        stepped = list(self.running.values())
        tokens = 0
        if plan.early_first_token:
            early = {req.rid for req in plan.joined}
            stepped = [req for req in stepped if req.rid not in early]
            tokens = len(plan.joined)
        draws = self.steps.draw(plan.batch, plan.decoding, stepped)
        observer = self.observer
        decode_tokens = i = 0
        for req in stepped:
            if req.produced == 0:
                self._first_token(req, end)
                tokens += 1
                continue
            gained = draws[i] if draws is not None else 1
            i += 1
            req.verify_steps += 1
            if observer is not None:
                observer.tokens(req, gained, end - req.last_token_at)
            gained = self._gain(req, gained, end)
            decode_tokens += gained
            tokens += gained
        self._recent.append(_StepRecord(start, end, tokens, decode_tokens, plan.decoding))
        # SGLang runs a prefill as a batch of its own and times only decode batches that follow one.
        if plan.joined:
            self._decode_start = None
        else:
            if self._decode_start is not None:
                self._add_decode_moment(plan.batch, (start - self._decode_start) * 1e6, decode_tokens)
            self._decode_start = start
        return stepped

    def _add_decode_moment(self, batch: int, step_us: float, generated: int) -> None:
        """One decode step into the moment sums, as SGLang's `_accumulate_decode_moment` adds it."""
        m = self.decode_moments
        m[0] += 1.0
        m[1] += batch
        m[2] += step_us
        m[3] += batch * batch
        m[4] += batch * step_us
        m[5] += generated

    def _first_token(self, req: SimRequest, at: float) -> None:
        """The joining step's prefill yields `req`'s first token at `at`."""
        req.first_token_at = at
        if self.observer is not None:
            self.observer.first_token(req, at)
        self._gain(req, 1, at)

    def _gain(self, req: SimRequest, gained: int, at: float) -> int:
        """`req` gains up to `gained` tokens at `at` and leaves if they end it; how many it gained."""
        gained = min(gained, req.max_new_tokens - req.produced)
        req.produced += gained
        req.last_token_at = at
        if req.stop and self._hit_stop(req, gained):
            self._leave(req, "stop", at)
        elif req.produced >= req.max_new_tokens:
            if req.natural_stop is not None:
                req.matched_stop = req.natural_stop
                self._leave(req, "stop", at)
            else:
                self._leave(req, "length", at)
        return gained

    def _log_cache_hits(self, plan: StepPlan) -> None:
        """SGLang's `cache_hit_rate`: set by each prefill batch, zeroed by the decode log."""
        if plan.joined:
            prompt = plan.cached_tokens + plan.prefill_tokens
            self.cache_hit_rate = plan.cached_tokens / prompt if prompt else 0.0
        if plan.decoding:
            self._decode_steps += 1
            if self._decode_steps % DECODE_LOG_INTERVAL == 0:
                self.cache_hit_rate = 0.0

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
        self._release(req)
        self._close(req, "finished", reason, at)

    def _release(self, req: SimRequest) -> None:
        """Give back `req`'s KV, keeping what it computed: its prompt and all its output but the last token."""
        computed: list[int] = []
        if self.kv.enabled and req.produced:
            computed = req.prompt_ids + self.text.token_ids(req.text_start, 0, req.produced - 1)
        self.kv.release(self._holds.pop(req.rid), computed)

    def _close(self, req: SimRequest, state: RequestState, reason: str, at: float) -> None:
        req.state = state
        req.finish_reason = reason
        if self.observer is not None:
            self.observer.finished(req, at)

    # ----- state for metrics and load reports -----

    def used_tokens(self) -> int:
        """KV tokens in use: the prefixes running requests lock, their uncached prompts and their output so far."""
        own = sum(r.prompt_tokens - r.cached_tokens + r.produced for r in self.running.values())
        return self.kv.tree.protected_size + own

    def reserved_tokens(self) -> int:
        """KV tokens held for running requests: their locked prefixes and their reservations."""
        return self.kv.tree.protected_size + self.kv.reserved

    def evictable_tokens(self) -> int:
        """Cached tokens no running request uses: reclaimed when room is needed."""
        return self.kv.tree.evictable_size

    def waiting_uncached_tokens(self) -> int:
        """Prompt tokens queued for prefill that the prefix cache would not serve now."""
        return sum(r.prompt_tokens - self.kv.peek(r.prompt_ids, _prefix_limit(r)) for r in self.waiting)

    def gen_throughput(self, now: float) -> float:
        """Output tokens/s over the last steps, 0 when idle for a second at `now`."""
        if not self._recent:
            return 0.0
        first, last = self._recent[0], self._recent[-1]
        if now - last.end > 1.0:
            return 0.0
        span = last.end - first.start
        return sum(s.tokens for s in self._recent) / span if span > 0 else 0.0

    def accept_length(self) -> float:
        """Mean tokens per decoding request per step over the last steps (1.0 without drafting)."""
        decoding = sum(s.decoding for s in self._recent)
        if decoding == 0:
            return self.table.tokens_per_step(max(len(self.running), 1))
        return sum(s.decode_tokens for s in self._recent) / decoding


def _prefix_limit(req: SimRequest) -> int:
    """Most prompt tokens the cache may serve: all but the last (one must be computed for the logits)."""
    limit = req.prompt_tokens - 1
    return limit if req.prefix_cap is None else min(limit, req.prefix_cap)
