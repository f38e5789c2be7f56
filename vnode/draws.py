"""Acceptance draws that belong to the request, not to the server: common random numbers for comparing routers.

The simulator's `StepModel` draws each step's accepted tokens from its server's own seeded stream,
so the same request gets other draws on another server or in another order, and two targets that
route alike still differ by luck (a few % per level at the family's request counts). `RequestDraws`
gives every request its own sequence instead, seeded by its prompt and output length and drawn from
the same distribution (1 + Binomial with mean tau): its k-th decode step gains the k-th value
wherever it runs, so targets that route alike produce the same numbers, and what differs is routing.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Iterable

from backends.sim.profiles import RoleProfile
from backends.sim.request import SimRequest
from backends.sim.steps import StepModel


class RequestDraws(StepModel):
    """A `StepModel` whose drafting steps give each request the next value of its own sequence."""

    def __init__(self, table: RoleProfile, seed: int, target: RoleProfile | None = None) -> None:
        super().__init__(table, seed, target)
        self._seed = seed
        self._sequences: dict[str, list[int]] = {}

    def draw(self, batch: int, decoding: int, running: Iterable[SimRequest] = ()) -> list[int] | None:
        if not self.speculating(batch) or decoding == 0:
            return None
        out = []
        for req in running:
            if req.produced:
                sequence = self._sequences.get(req.rid)
                if sequence is None:
                    sequence = self._sequences[req.rid] = self._sequence(req)
                gained = sequence[req.verify_steps]
                if req.produced + gained >= req.max_new_tokens:
                    del self._sequences[req.rid]  # its last step
                out.append(gained)
        return out

    def _sequence(self, req: SimRequest) -> list[int]:
        """One value per decode step the request can take (verify steps are counted from 0)."""
        prompt = zlib.crc32(array("q", req.prompt_ids).tobytes())
        rng = random.Random(f"{self._seed}/{prompt}/{req.max_new_tokens}")
        return rng.choices(self._values, cum_weights=self._cum_weights, k=max(req.max_new_tokens - 1, 1))
