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
    """

    def __init__(self, table: RoleProfile, seed: int) -> None:
        self.table = table
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
