"""A workload: which dataset, how lengths, arrivals and service tiers are drawn; one plan per level."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from loadtest.workloads.lengths import LengthDist
from loadtest.workloads.level import Draw, Level, RequestsPerLevel
from loadtest.workloads.multi_turn import MultiTurn
from loadtest.workloads.plan import Plan
from loadtest.workloads.random_prompts import RandomPrompts
from loadtest.workloads.shared_prefix import SharedPrefix
from loadtest.workloads.tiers import TierMix
from loadtest.workloads.trace import TraceReplay

Dataset = RandomPrompts | SharedPrefix | MultiTurn | TraceReplay
DATASETS = ("random", "shared-prefix", "multi-turn", "trace")


@dataclass(frozen=True)
class Workload:
    """Everything that shapes a sweep's requests and when they are sent.

    `plan(level, index)` depends on nothing else (no clock, no server), so every target, and any
    model of the server, gets the very same plan for a level.
    """

    dataset: Dataset = field(default_factory=RandomPrompts)
    input_len: int = 128
    output_len: int = 128
    lengths: LengthDist = field(default_factory=LengthDist)
    requests_per_level: RequestsPerLevel = field(default_factory=lambda: RequestsPerLevel(64))
    burstiness: float = 1.0
    tier_mix: TierMix | None = None
    seed: int = 0

    def plan(self, level: Level, index: int) -> Plan:
        """The plan of the level at position `index` of the sweep."""
        per_level = self.requests_per_level
        if level.concurrency is not None:
            requests = per_level.for_concurrency(level.concurrency)
        else:
            requests = level.rate_step.requests if level.rate_step is not None else per_level.count
        draw = Draw(level, index, self.seed, requests, self.input_len, self.output_len, self.lengths, self.burstiness)
        plan = self.dataset.plan(draw)
        if self.tier_mix is None:
            return plan
        rng = draw.rng("tiers")
        return replace(plan, sessions=tuple(replace(s, tier=self.tier_mix.draw(rng)) for s in plan.sessions))

    def settings(self) -> dict[str, Any]:
        """What results.json's `settings` records of the workload."""
        return {
            "dataset": self.dataset.settings(),
            "length_dist": self.lengths.kind,
            "length_median_ratio": self.lengths.median_ratio,
            "burstiness": self.burstiness,
            "tier_mix": str(self.tier_mix) if self.tier_mix is not None else None,
        }
