"""The typed shape of a sweep's results, and the one place it turns into results.json and back.

A `ResultsDocument` holds `LevelResult`s (one per load level), each holding a `TargetResult` per
target (its `LevelStats` and `Monitor`), named as the data names them. `to_json`/`from_json` here
are the only code that knows the file's keys: the keys are a user contract, so files written by
earlier versions load unchanged and a loaded file writes back the same keys. The judgements
it carries (the load generator's health, the envelope's checks) are typed in `loadtest.verdicts`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from loadtest.stats import LATENCY_METRICS, Distribution, LevelStats, TierStats, TrafficStats
from loadtest.verdicts import EnvelopeVerdict, Health
from loadtest.workloads.level import Level, RateStep

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
    if stats.traffic is not None:
        out.update(_traffic_to_json(stats.traffic))
    return out


def _traffic_to_json(traffic: TrafficStats) -> Json:
    tiers = traffic.tiers
    return {
        "total_cached_tokens": traffic.total_cached_tokens,
        "cache_hit_rate": traffic.cache_hit_rate,
        "goodput_request_s": traffic.goodput_request_s,
        "tiers": {name: asdict(t) for name, t in tiers.items()} if tiers is not None else None,
    }


def _stats_from_json(raw: Json) -> LevelStats:
    latencies = {name: Distribution(*(raw[f"{name}_{stat}_ms"] for stat in _STATS)) for name in LATENCY_METRICS}
    plain = {k: raw[k] for k in (
        "completed", "failed", "errors", "duration_s", "request_s", "output_tok_s", "input_tok_s", "total_output_tokens",
        "total_input_tokens", "mean_concurrency", "usage_missing", "mean_chunk_interval_ms", "backend_share",
    )}
    traffic = None
    if "cache_hit_rate" in raw:  # written since results recorded the traffic's cache, goodput and tiers
        tiers = raw["tiers"]
        traffic = TrafficStats(
            raw["total_cached_tokens"], raw["cache_hit_rate"], raw["goodput_request_s"],
            {name: TierStats(**t) for name, t in tiers.items()} if tiers is not None else None,
        )
    return LevelStats(**plain, **latencies, traffic=traffic)


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
    """Every target at one load level (closed-loop concurrency, open-loop rate, or a trace's time scale).

    `ratios` are per-level figures computed across targets (the envelope's `throughput_ratio`,
    `tpot_ratio`, ..., `failed_requests`), written beside `targets`; empty for a plain sweep.
    `best` names the baseline each ratio was taken against (`{"throughput": "plain-dp", "tpot":
    "eagle-dp"}`), None where not recorded. `offered_request_s`: the requests per second an open
    level offered, on the clock `request_s` is measured on; `trace_time_scale`: a trace level's
    factor; `rate_step`: a rate-step level's schedule. Each is None where it does not apply (and
    left out of the file).
    """

    concurrency: int | None
    request_rate: float | None
    requests: int
    targets: Mapping[str, TargetResult]
    ratios: Mapping[str, float | None] = field(default_factory=dict)
    best: Mapping[str, str | None] | None = None
    offered_request_s: float | None = None
    trace_time_scale: float | None = None
    rate_step: RateStep | None = None

    @property
    def label(self) -> str:
        """`C=8`, `4/s`, `step 2-8/s x30s` or `trace x0.5`."""
        return Level(self.concurrency, self.request_rate, self.trace_time_scale, self.rate_step).label

    @property
    def x(self) -> float | None:
        """Where the level sits on a plot's x axis: its concurrency or rate (a trace's: the rate it offered).

        An infinite rate reads back from JSON as None.
        """
        if self.concurrency is not None:
            return self.concurrency
        return self.request_rate if self.trace_time_scale is None and self.rate_step is None else self.offered_request_s

    def to_json(self) -> Json:
        """One entry of `levels` in results.json."""
        step = self.rate_step
        extra = {k: v for k, v in (("offered_request_s", self.offered_request_s), ("trace_time_scale", self.trace_time_scale),
                                   ("rate_step", None if step is None else [step.low, step.high, step.seconds]))
                 if v is not None}
        return {
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            **extra,
            "requests": self.requests,
            "targets": {name: t.to_json() for name, t in self.targets.items()},
            **self.ratios,
            **({"best": dict(self.best)} if self.best is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Json) -> LevelResult:
        """Read one entry of `levels`; keys beyond the known ones are its ratios."""
        known = ("concurrency", "request_rate", "offered_request_s", "trace_time_scale", "rate_step", "requests", "targets",
                 "best")
        return cls(
            concurrency=raw["concurrency"],
            request_rate=raw["request_rate"],
            requests=raw["requests"],
            targets={name: TargetResult.from_json(t) for name, t in raw["targets"].items()},
            ratios={k: v for k, v in raw.items() if k not in known},
            best=raw.get("best"),
            offered_request_s=raw.get("offered_request_s"),
            trace_time_scale=raw.get("trace_time_scale"),
            rate_step=RateStep(*raw["rate_step"]) if "rate_step" in raw else None,
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
            if level.x is not None and math.isfinite(level.x) and y is not None:
                xs.append(level.x)
                ys.append(y)
        return xs, ys


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
