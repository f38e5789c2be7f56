"""What the engines' own cumulative counters on `/v1/loads` teach, streamed traffic or not.

SGLang keeps per rank the uncached prompt tokens its prefill steps ran (`total_prefill_uncached_tokens`)
and the microseconds those took (`total_prefill_busy_us`), and its decode step-time moment sums
(`decode_moments`: steps, batch, step microseconds, batch squared, batch times step, tokens generated;
each decode step timed from the previous one's launch). Between two reports of one backend their
differences give its prefill seconds per uncached token, and its mean decode batch with the seconds
per output token there: measured by the engine on every request, however the client asked for the
answer. The pool carries the latest report on each backend's view, and its own counter of the prompt
tokens routed requests were sent to prefill, whose mean prices the prefill each request brings.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.pool.snapshot import BackendView, PoolSnapshot

# Counters are read once they have moved by at least this many tokens: a few short prompts' prefill is
# mostly the step's fixed cost, not their tokens.
MIN_TOKENS = 256
# Decode moments are read once at least this many steps were added: fewer are a handful of acceptance draws.
MIN_STEPS = 16
RATE = 0.05  # weight of each reading in the mean, as the policy weighs each response's


class EnginePrefill:
    """Per kind (speculative or not), the mean seconds of prefill per uncached prompt token its engines report."""

    def __init__(self) -> None:
        self.cost: dict[bool, float] = {}
        self._seen: dict[str, tuple[int, int]] = {}  # backend -> (tokens, busy microseconds) last read

    def read(self, view: BackendView) -> None:
        """Fold in `view`'s counters if they moved by `MIN_TOKENS` since last read; a restarted engine
        (counters lower than before) starts over from its new report."""
        tokens, busy = view.prefill_tokens, view.prefill_busy_us
        if tokens <= 0:
            return  # not reported, or nothing prefilled yet
        seen = self._seen.get(view.name)
        if seen is None or tokens < seen[0] or busy < seen[1]:
            self._seen[view.name] = (tokens, busy)
            return
        added = tokens - seen[0]
        if added < MIN_TOKENS:
            return
        self._seen[view.name] = (tokens, busy)
        per_token = (busy - seen[1]) * 1e-6 / added
        known = self.cost.get(view.speculative)
        self.cost[view.speculative] = per_token if known is None else known + RATE * (per_token - known)


@dataclass(frozen=True)
class StepReading:
    """A backend's decode steps between two reports: their mean batch, and seconds per output token there."""

    batch: float
    tpot: float
    tokens: int  # output tokens they generated
    request_steps: int  # the batch summed over the steps: a request's steps, as a stream's chunks count them
    alone: bool  # the other servers of its group ran no decode step meanwhile (as far as their reports say)


class EngineSteps:
    """Per backend, the decode steps its engine reported since it was last read."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[float, ...], float]] = {}  # backend -> (moments, its group's other steps)

    def read(self, view: BackendView, others: float) -> StepReading | None:
        """`view`'s steps since its last reading, once there are `MIN_STEPS`, `others` being the decode steps
        the other servers of its group have reported so far; None before. A restarted engine (fewer steps
        than before) starts over from its new report."""
        moments = view.decode_moments
        if moments is None:
            return None
        seen = self._seen.get(view.name)
        if seen is None or moments[0] < seen[0][0]:
            self._seen[view.name] = (moments, others)
            return None
        steps, batch, step_us, _, _, generated = (now - then for now, then in zip(moments, seen[0], strict=True))
        if steps < MIN_STEPS:
            return None
        self._seen[view.name] = (moments, others)
        if batch <= 0.0 or step_us <= 0.0 or generated <= 0.0:
            return None
        # Each request gains generated / batch tokens a step: seconds per token = mean step over that.
        tpot = step_us * 1e-6 / steps * batch / generated
        return StepReading(batch / steps, tpot, round(generated), round(batch), others == seen[1])


class SentPrompts:
    """The mean prompt tokens a routed request was sent to prefill (what the prefix map predicted its backend
    lacked), from the pool's counter of them read at each routing decision: it moved by those counted since
    the last (a stream's at its first token), one request's on average."""

    def __init__(self) -> None:
        self.mean: float | None = None
        self._total: float | None = None

    def read(self, snapshot: PoolSnapshot) -> None:
        """Fold in what was sent since the last reading (a counter that went down starts over)."""
        total = sum(view.sent_prompt_tokens for view in snapshot.backends)
        added, self._total = (total - self._total if self._total is not None else None), total
        if added is None or added < 0.0:
            return
        self.mean = added if self.mean is None else self.mean + RATE * (added - self.mean)
