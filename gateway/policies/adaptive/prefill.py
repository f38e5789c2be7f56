"""Each kind's prefill cost per uncached prompt token as its engines count it, streamed traffic or not.

SGLang keeps two cumulative counters per rank on `/v1/loads`: the uncached prompt tokens its prefill
steps ran (`total_prefill_uncached_tokens`) and the microseconds those steps took
(`total_prefill_busy_us`). Between two reports of one backend their differences give its seconds of
prefill per uncached token, measured by the engine on every request, however the client asked for
the answer. The pool carries the latest report on each backend's view.
"""

from __future__ import annotations

from gateway.pool.snapshot import BackendView

# Counters are read once they have moved by at least this many tokens: a few short prompts' prefill is
# mostly the step's fixed cost, not their tokens.
MIN_TOKENS = 256
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
