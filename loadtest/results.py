"""The typed shape of a sweep's results, and the one place it turns into results.json and back.

A `ResultsDocument` holds `LevelResult`s (one per load level), each holding a `TargetResult` per
target (its `LevelStats` and `Monitor`), named as the data names them. `to_json`/`from_json` here
are the only code that knows the file's keys: the keys are a user contract, so files written by
earlier versions load unchanged and a loaded file writes back the same keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from loadtest.stats import LATENCY_METRICS, Distribution, LevelStats

Json = dict[str, Any]
_STATS = ("p50", "p90", "p99", "mean")


@dataclass(frozen=True)
class Monitor:
    """The self-checks measured while one target ran one level.

    `loop_lag`: the load generator's event-loop lag (`p50_ms`, `p99_ms`, `max_ms`); `cpu`: percent
    of a core per process group (`loadgen_cpu_pct`, ...), `machine_busy_pct` and `cores`;
    `sim_slip`: per simulator URL its schedule slip (`slip_ms`, `steps`, `mean_step_lateness_ms`),
    None where a server exports none; the whole field is None when no probe ran.
    """

    loop_lag: Mapping[str, float | None]
    cpu: Mapping[str, float]
    sim_slip: Mapping[str, Mapping[str, float] | None] | None = None

    @property
    def loop_lag_p99_ms(self) -> float | None:
        """The event loop's p99 lag during the level."""
        return self.loop_lag.get("p99_ms")

    def sim_lateness_ms(self) -> list[float]:
        """Mean step lateness (ms) of each simulator that reported it during the level."""
        return [v["mean_step_lateness_ms"] for v in (self.sim_slip or {}).values() if v]

    def to_json(self) -> Json:
        """The `monitor` object of results.json."""
        out: Json = {"loop_lag": dict(self.loop_lag), "cpu": dict(self.cpu)}
        if self.sim_slip is not None:
            out["sim_slip"] = {url: dict(v) if v is not None else None for url, v in self.sim_slip.items()}
        return out

    @classmethod
    def from_json(cls, raw: Json) -> Monitor:
        """Read a `monitor` object."""
        return cls(raw["loop_lag"], raw["cpu"], raw.get("sim_slip"))


def _stats_to_json(stats: LevelStats) -> Json:
    """A target's numbers as the flat keys of results.json (`ttft_p50_ms`, ...)."""
    out: Json = {
        "completed": stats.completed,
        "failed": stats.failed,
        "errors": dict(stats.errors),
        "duration_s": stats.duration_s,
        "request_s": stats.request_s,
        "output_tok_s": stats.output_tok_s,
        "input_tok_s": stats.input_tok_s,
        "total_output_tokens": stats.total_output_tokens,
        "total_input_tokens": stats.total_input_tokens,
        "mean_concurrency": stats.mean_concurrency,
        "usage_missing": stats.usage_missing,
        "mean_chunk_interval_ms": stats.mean_chunk_interval_ms,
    }
    for name in LATENCY_METRICS:
        dist: Distribution = getattr(stats, name)
        for stat in _STATS:
            out[f"{name}_{stat}_ms"] = getattr(dist, stat)
    out["backend_share"] = dict(stats.backend_share) if stats.backend_share is not None else None
    return out


def _stats_from_json(raw: Json) -> LevelStats:
    latencies = {name: Distribution(*(raw[f"{name}_{stat}_ms"] for stat in _STATS)) for name in LATENCY_METRICS}
    plain = {k: raw[k] for k in (
        "completed", "failed", "errors", "duration_s", "request_s", "output_tok_s", "input_tok_s", "total_output_tokens",
        "total_input_tokens", "mean_concurrency", "usage_missing", "mean_chunk_interval_ms", "backend_share",
    )}
    return LevelStats(**plain, **latencies)


@dataclass(frozen=True)
class TargetResult:
    """One target at one load level: its numbers, and the self-checks measured meanwhile."""

    stats: LevelStats
    monitor: Monitor

    def scalars(self) -> Json:
        """Every number as the flat keys of results.json, monitor excluded."""
        return _stats_to_json(self.stats)

    def to_json(self) -> Json:
        """One target's object inside a level of results.json."""
        return {**_stats_to_json(self.stats), "monitor": self.monitor.to_json()}

    @classmethod
    def from_json(cls, raw: Json) -> TargetResult:
        """Read one target's object."""
        return cls(_stats_from_json(raw), Monitor.from_json(raw["monitor"]))


@dataclass(frozen=True)
class LevelResult:
    """Every target at one load level (closed-loop concurrency or open-loop rate).

    `ratios` are per-level figures computed across targets (the envelope's `throughput_ratio` and
    `tpot_ratio`), written beside `targets`; empty for a plain sweep. `best` names the baseline each
    ratio was taken against (`{"throughput": "plain-dp", "tpot": "eagle-dp"}`), None where not recorded.
    """

    concurrency: int | None
    request_rate: float | None
    requests: int
    targets: Mapping[str, TargetResult]
    ratios: Mapping[str, float | None] = field(default_factory=dict)
    best: Mapping[str, str | None] | None = None

    @property
    def label(self) -> str:
        """`C=8` or `4/s`."""
        return f"C={self.concurrency}" if self.concurrency is not None else f"{self.request_rate:g}/s"

    @property
    def x(self) -> float | None:
        """Where the level sits on a plot's x axis (an infinite rate reads back from JSON as None)."""
        return self.concurrency if self.concurrency is not None else self.request_rate

    def to_json(self) -> Json:
        """One entry of `levels` in results.json."""
        return {
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "requests": self.requests,
            "targets": {name: t.to_json() for name, t in self.targets.items()},
            **self.ratios,
            **({"best": dict(self.best)} if self.best is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Json) -> LevelResult:
        """Read one entry of `levels`; keys beyond the known ones are its ratios."""
        known = ("concurrency", "request_rate", "requests", "targets", "best")
        return cls(
            concurrency=raw["concurrency"],
            request_rate=raw["request_rate"],
            requests=raw["requests"],
            targets={name: TargetResult.from_json(t) for name, t in raw["targets"].items()},
            ratios={k: v for k, v in raw.items() if k not in known},
            best=raw.get("best"),
        )


@dataclass(frozen=True)
class TargetSeries:
    """One target across the levels where it ran: `points` pairs each level with its result there."""

    name: str
    url: str
    points: tuple[tuple[LevelResult, TargetResult], ...]

    def values(self, metric: Callable[[TargetResult], float | None]) -> tuple[list[float], list[float]]:
        """(x, y) of the levels where both are defined, e.g. `series.values(lambda t: t.stats.tpot.p50)`."""
        xs: list[float] = []
        ys: list[float] = []
        for level, result in self.points:
            y = metric(result)
            if level.x is not None and y is not None:
                xs.append(level.x)
                ys.append(y)
        return xs, ys


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
    worst_at: int | None

    def to_json(self) -> Json:
        """One entry of `envelope.checks`."""
        return {"name": self.name, "op": self.op, "bound": self.bound, "met": self.met,
                "worst": self.worst, "worst_at": self.worst_at}

    @classmethod
    def from_json(cls, raw: Json) -> BoundCheck:
        """Read one check."""
        return cls(raw["name"], raw["op"], raw["bound"], raw["met"], raw["worst"], raw["worst_at"])


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


@dataclass(frozen=True)
class ResultsDocument:
    """A whole results.json: what ran, how, every level's numbers, and the self-check verdict.

    `targets` maps each target's name to its URL, in the order they ran; `settings`, `versions`
    and `stack` echo inputs as given. `title`, `stack`, `preamble` and `envelope` are set by
    runs that have them (the envelope) and left out of the file otherwise.
    """

    kind: str
    command: str
    timestamp: str
    versions: Mapping[str, str]
    mode: str
    settings: Mapping[str, Any]
    targets: Mapping[str, str]
    levels: tuple[LevelResult, ...]
    health: Health
    title: str | None = None
    stack: Mapping[str, Any] | None = None
    preamble: tuple[str, ...] | None = None
    envelope: EnvelopeVerdict | None = None

    def series(self, name: str) -> TargetSeries:
        """One target across the levels."""
        points = tuple((lv, lv.targets[name]) for lv in self.levels if name in lv.targets)
        return TargetSeries(name, self.targets[name], points)

    def to_json(self) -> Json:
        """results.json as a JSON-ready dict, keys in the file's order."""
        out: Json = {
            "kind": self.kind,
            "command": self.command,
            "timestamp": self.timestamp,
            "versions": dict(self.versions),
            "mode": self.mode,
            "settings": dict(self.settings),
            "targets": dict(self.targets),
            "levels": [lv.to_json() for lv in self.levels],
        }
        if self.title is not None:
            out["title"] = self.title
        if self.stack is not None:
            out["stack"] = dict(self.stack)
        if self.preamble is not None:
            out["preamble"] = list(self.preamble)
        out["health"] = self.health.to_json()
        if self.envelope is not None:
            out["envelope"] = self.envelope.to_json()
        return out

    @classmethod
    def from_json(cls, raw: Json) -> ResultsDocument:
        """Read results.json's dict."""
        return cls(
            kind=raw["kind"], command=raw["command"], timestamp=raw["timestamp"], versions=raw["versions"],
            mode=raw["mode"], settings=raw["settings"], targets=raw["targets"],
            levels=tuple(LevelResult.from_json(lv) for lv in raw["levels"]),
            health=Health.from_json(raw["health"]),
            title=raw.get("title"), stack=raw.get("stack"),
            preamble=tuple(raw["preamble"]) if "preamble" in raw else None,
            envelope=EnvelopeVerdict.from_json(raw["envelope"]) if "envelope" in raw else None,
        )

    def dumps(self) -> bytes:
        """The bytes of results.json."""
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)

    @classmethod
    def load(cls, path: Path) -> ResultsDocument:
        """Read a results.json file."""
        return cls.from_json(orjson.loads(path.read_bytes()))
