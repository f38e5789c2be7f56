"""What one decode step of a role costs and yields: the step-time model plus seeded token draws."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

from backends.sim.profiles import RoleProfile
from backends.sim.request import SimRequest


class StepModel:
    """Duration and per-request token yield of a step of one role's server.

    A drafting step gives each decoding request an integer number of tokens in 1..num_draft_tokens:
    1 + Binomial(num_draft_tokens - 1, p), with p chosen so that the mean is `tau` (the bonus token
    is always accepted, each draft token with probability p). Plain steps give exactly 1.

    `target` is the table of the model that a drafting server's prefill runs: its target model, which
    is the plain server's. SGLang runs a new request's prefill as a batch of its own, the target's
    forward over the prompt and then the draft's extend over it
    (`srt/speculative/eagle_worker_v2.py::_forward_prefill_batch`), and the first token comes from
    that target forward: no draft chain and no verify precede it. So a joiner's first token costs its
    prefill plus one target step, not one drafting step (`first_token_ms`).
    """

    def __init__(self, table: RoleProfile, seed: int, target: RoleProfile | None = None) -> None:
        self.table = table
        self.target = target
        self._rng = random.Random(seed)
        extra = table.num_draft_tokens - 1
        p = (table.tau - 1.0) / extra if extra else 0.0
        self._values = list(range(1, table.num_draft_tokens + 1))
        cumulative = 0.0
        self._cum_weights: list[float] = []
        for k in range(extra + 1):
            cumulative += math.comb(extra, k) * p**k * (1.0 - p) ** (extra - k)
            self._cum_weights.append(cumulative)

    def duration_ms(self, batch: int, prefill_tokens: int) -> float:
        """Modelled step time, ms: the decode step at `batch` plus the prefill of joining prompts."""
        return self.table.step_ms(batch) + self.table.prefill_ms_per_token * prefill_tokens

    def first_token_ms(self, batch: int, prefill_tokens: int) -> float:
        """When, from a step's start, its joiners have their first token, ms: the step's whole duration,
        or with a `target` its prefill plus one target step at `batch` when that is sooner."""
        duration = self.duration_ms(batch, prefill_tokens)
        if self.target is None:
            return duration
        return min(self.target.step_ms(batch) + self.table.prefill_ms_per_token * prefill_tokens, duration)

    def speculating(self, batch: int) -> bool:
        """Whether a step at `batch` drafts (and so may yield several tokens per request)."""
        return self.table.is_speculating(batch) and len(self._values) > 1

    def draw(self, batch: int, decoding: int, running: Iterable[SimRequest] = ()) -> list[int] | None:
        """Tokens gained by each of `decoding` requests in a step at `batch`; None when each gains 1.

        `running` is the step's batch in the order the draws are used (its decoding requests are those
        past their first token); this model draws from its own seeded stream and does not look at it.
        """
        if not self.speculating(batch) or decoding == 0:
            return None
        return self._rng.choices(self._values, cum_weights=self._cum_weights, k=decoding)
