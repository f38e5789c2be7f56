"""The judgements a results file carries: did the load generator keep up, and did the envelope's bounds hold.

Like `loadtest.results`, whose document holds them, these types alone know their results.json keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Json = dict[str, Any]


@dataclass(frozen=True)
class Health:
    """Whether the load generator, not the server, may have shaped the numbers: limits, worst figures, flags."""

    limits: Mapping[str, float]
    worst_loop_lag_p99_ms: float
    worst_loadgen_cpu_pct: float
    worst_machine_busy_pct: float
    worst_sim_step_lateness_ms: float | None
    flagged: tuple[str, ...]
    worst_balancer_cpu_pct: float | None = None  # None: no balancer ran (and files written before it existed)

    @property
    def ok(self) -> bool:
        """No level crossed a limit."""
        return not self.flagged

    def to_json(self) -> Json:
        """The `health` object of results.json."""
        return {
            "limits": dict(self.limits),
            "worst_loop_lag_p99_ms": self.worst_loop_lag_p99_ms,
            "worst_loadgen_cpu_pct": self.worst_loadgen_cpu_pct,
            "worst_machine_busy_pct": self.worst_machine_busy_pct,
            "worst_sim_step_lateness_ms": self.worst_sim_step_lateness_ms,
            **({"worst_balancer_cpu_pct": self.worst_balancer_cpu_pct} if self.worst_balancer_cpu_pct is not None else {}),
            "flagged": list(self.flagged),
            "ok": self.ok,
        }

    @classmethod
    def from_json(cls, raw: Json) -> Health:
        """Read a `health` object (`ok` follows from `flagged`)."""
        return cls(
            raw["limits"], raw["worst_loop_lag_p99_ms"], raw["worst_loadgen_cpu_pct"], raw["worst_machine_busy_pct"],
            raw["worst_sim_step_lateness_ms"], tuple(raw["flagged"]), raw.get("worst_balancer_cpu_pct"),
        )


@dataclass(frozen=True)
class BoundCheck:
    """One bound checked over every level: `name op bound`, whether it held, and the worst level."""

    name: str
    op: Literal[">=", "<="]
    bound: float
    met: bool
    worst: float | None  # None when no level measured the ratio
    worst_at: float | None  # the worst level's concurrency (its rate or offered rate for an open loop)
    worst_level: str | None = None  # its label (`C=4`, `2/s`, `trace x0.5`); None in files written before

    @property
    def where(self) -> str:
        """The worst level as the report names it."""
        return self.worst_level if self.worst_level is not None else f"C={self.worst_at}"

    def to_json(self) -> Json:
        """One entry of `envelope.checks`."""
        out: Json = {"name": self.name, "op": self.op, "bound": self.bound, "met": self.met,
                     "worst": self.worst, "worst_at": self.worst_at}
        if self.worst_level is not None:
            out["worst_level"] = self.worst_level
        return out

    @classmethod
    def from_json(cls, raw: Json) -> BoundCheck:
        """Read one check."""
        return cls(raw["name"], raw["op"], raw["bound"], raw["met"], raw["worst"], raw["worst_at"], raw.get("worst_level"))


@dataclass(frozen=True)
class Comparison:
    """Which target the ratios judge (`subject`) against which targets (`baselines`), and by which rule.

    `carrying_within`: the TPOT ratio is taken against the lowest TPOT p50 of the baselines that carry
    the load, those within this share of the best baseline throughput (0.1: at least 90% of it), so a
    capped server that queues the rest cannot set the bar. None: against every baseline (the
    single-server comparison). `kind` labels the comparison: "same-hardware" (the same GPUs run
    each way) or "single" (specgate against the servers it routes to).
    """

    subject: str
    baselines: tuple[str, ...]
    carrying_within: float | None = None
    kind: str = "single"


@dataclass(frozen=True)
class EnvelopeVerdict:
    """The envelope's bound checks, and the comparison its ratios were taken over.

    `comparison` is None for a file written before results recorded it.
    """

    checks: tuple[BoundCheck, ...]
    comparison: Comparison | None = None

    @property
    def all_met(self) -> bool:
        """Every bound held at every level."""
        return all(c.met for c in self.checks)

    def to_json(self) -> Json:
        """The `envelope` object of results.json."""
        out: Json = {"checks": [c.to_json() for c in self.checks], "all_met": self.all_met}
        if self.comparison is not None:
            out["subject"] = self.comparison.subject
            out["baselines"] = list(self.comparison.baselines)
            if self.comparison.kind != "single":
                out["comparison"] = self.comparison.kind
            if self.comparison.carrying_within is not None:
                out["carrying_within"] = self.comparison.carrying_within
        return out

    @classmethod
    def from_json(cls, raw: Json) -> EnvelopeVerdict:
        """Read an `envelope` object."""
        comparison = (
            Comparison(raw["subject"], tuple(raw["baselines"]), raw.get("carrying_within"), raw.get("comparison", "single"))
            if "subject" in raw
            else None
        )
        return cls(tuple(BoundCheck.from_json(c) for c in raw["checks"]), comparison)
