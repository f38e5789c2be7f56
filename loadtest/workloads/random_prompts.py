"""The `random` dataset: unique prompts of random words, one request per session (no shared prefix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from loadtest.prompts import PromptFactory
from loadtest.workloads.arrivals import schedule
from loadtest.workloads.level import Draw
from loadtest.workloads.plan import Plan, Session, Turn


@dataclass(frozen=True)
class RandomPrompts:
    """`--requests-per-level` prompts of `--input-len` tokens, each asking for `--output-len` tokens.

    A level's prompts come from `PromptFactory` seeded by the run's seed and the level's index, as
    they always have: a seed gives the prompts of results committed before the other datasets.
    """

    name: ClassVar[str] = "random"

    def plan(self, draw: Draw) -> Plan:
        """The level's plan."""
        seed = draw.seed * 1_000_003 + draw.index
        specs = PromptFactory(draw.input_len, draw.output_len, seed=seed, lengths=draw.lengths).take(draw.requests)
        return schedule([Session((Turn((spec.prompt,), spec.output_len),)) for spec in specs], draw)

    def settings(self) -> dict[str, Any]:
        """The dataset's options, for results.json."""
        return {"name": self.name}
