"""A sweep: every target at every load level, with the same requests for every target at a level."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from loadtest.client import (
    Endpoint,
    TargetClient,
    TargetOptions,
    open_session,
    served_model,
)
from loadtest.load import closed_loop, run_plan
from loadtest.monitor import CpuMeter, LoopLagMonitor
from loadtest.prompts import PromptFactory
from loadtest.records import LevelRun, RequestRecord
from loadtest.results import LevelResult, Monitor, TargetResult
from loadtest.slip import SlipProbe
from loadtest.stats import LevelStats, Slo, level_stats
from loadtest.workloads.lengths import LengthDist
from loadtest.workloads.level import Level, RequestsPerLevel
from loadtest.workloads.plan import Plan
from loadtest.workloads.random_prompts import RandomPrompts
from loadtest.workloads.tiers import TierMix
from loadtest.workloads.workload import Dataset, Workload

__all__ = [
    "Level", "LevelHook", "Progress", "RequestsPerLevel", "Sweep", "SweepSettings", "Target", "parse_levels",
    "parse_trace_levels",
]

_TARGET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Target:
    """A named OpenAI-compatible server, e.g. `specgate=http://127.0.0.1:8000`."""

    name: str
    url: str

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse `NAME=URL`."""
        name, sep, url = text.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"target must be NAME=URL, got {text!r}")
        if not _TARGET_NAME.match(name):
            raise ValueError(f"target name may use letters, digits, '_', '.', '-' only, got {name!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"target URL must start with http:// or https://, got {url!r}")
        return cls(name, url.rstrip("/"))


@dataclass(frozen=True)
class SweepSettings:
    """Everything that shapes the requests of a sweep.

    `lengths` None: uniform from `range_ratio` below 1, else fixed (as before it existed).
    `time_scale` multiplies every time of the workload (arrivals, think times, a trace's clock) and
    the SLOs: the envelope's simulators run that much slower than the model, and so do its users.
    """

    levels: tuple[Level, ...]
    requests_per_level: RequestsPerLevel
    input_len: int
    output_len: int
    range_ratio: float = 1.0
    stream: bool = True
    endpoint: Endpoint = "chat"
    api_key: str | None = None
    warmup: int = 1
    seed: int = 0
    timeout: float = 600.0
    dataset: Dataset = field(default_factory=RandomPrompts)
    lengths: LengthDist | None = None
    burstiness: float = 1.0
    tier_mix: TierMix | None = None
    slo: Slo = field(default_factory=Slo)
    time_scale: float = 1.0

    @property
    def workload(self) -> Workload:
        """The workload the levels' plans are drawn from."""
        return Workload(
            dataset=self.dataset, input_len=self.input_len, output_len=self.output_len,
            lengths=self.lengths or LengthDist.of(None, self.range_ratio), requests_per_level=self.requests_per_level,
            burstiness=self.burstiness, tier_mix=self.tier_mix, seed=self.seed,
        )

    def plans(self) -> list[Plan]:
        """Every level's plan, in level order."""
        workload = self.workload
        return [workload.plan(level, index) for index, level in enumerate(self.levels)]


class Progress(Protocol):
    """What the sweep tells whoever shows progress."""

    def level_started(self, target: str, level: Level, total: int) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...

    def level_finished(self, target: str, level: Level, stats: LevelStats) -> None: ...


# Awaited with a target's name and a level just before that target runs that level (e.g. to flush
# the caches of servers the targets share); nothing of it is measured.
LevelHook = Callable[[str, Level], Awaitable[None]]


class Sweep:
    """Runs `settings` against `targets`; `slip` reads schedule slip, `cpu` CPU use, `before_level` readies each run."""

    def __init__(
        self,
        targets: Sequence[Target],
        settings: SweepSettings,
        progress: Progress,
        cpu: CpuMeter | None = None,
        slip: SlipProbe | None = None,
        before_level: LevelHook | None = None,
    ) -> None:
        if not targets:
            raise ValueError("at least one --target is needed")
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise ValueError(f"target names must be unique, got {names}")
        self.targets = list(targets)
        self.settings = settings
        self.progress = progress
        self.cpu = cpu or CpuMeter()
        self.slip = slip
        self.before_level = before_level

    async def run(self) -> list[LevelResult]:
        """Run every level against every target, in level order (targets side by side in time)."""
        s = self.settings
        plans = s.plans()
        results: list[LevelResult] = []
        # Enough connections for the most requests a level can have in flight at once.
        connections = max(p.concurrency or len(p.sessions) for p in plans) + 8
        async with open_session(connections, s.timeout) as session:
            clients = await self._clients(session)
            await self._warm_up(clients)
            async with LoopLagMonitor() as lag:
                for level, plan in zip(s.levels, plans, strict=True):
                    targets: dict[str, TargetResult] = {}
                    for target in self.targets:
                        run = await self._run_level(clients[target.name], level, plan, target.name)
                        stats = level_stats(run, slo=s.slo.scaled(s.time_scale))
                        targets[target.name] = TargetResult(stats, await self._monitor(lag))
                        self.progress.level_finished(target.name, level, stats)
                    offered = plan.offered_request_s / s.time_scale if plan.offered_request_s is not None else None
                    results.append(LevelResult(
                        level.concurrency, level.request_rate, plan.requests, targets,
                        offered_request_s=offered, trace_time_scale=level.trace_time_scale, rate_step=level.rate_step,
                    ))
        return results

    async def _clients(self, session: aiohttp.ClientSession) -> dict[str, TargetClient]:
        s = self.settings
        options = TargetOptions(endpoint=s.endpoint, stream=s.stream, api_key=s.api_key)
        clients = {}
        for target in self.targets:
            model = await served_model(session, target.url, s.api_key)
            clients[target.name] = TargetClient(session, target.url, model, options)
        return clients

    async def _warm_up(self, clients: dict[str, TargetClient]) -> None:
        s = self.settings
        if s.warmup < 1:
            return
        specs = list(PromptFactory(s.input_len, min(s.output_len, 16), seed=s.seed - 1).take(s.warmup))
        for client in clients.values():
            run = await closed_loop(client.send, specs, concurrency=s.warmup)
            failed = [r for r in run.records if not r.ok]
            if len(failed) == len(run.records):
                first = failed[0]
                raise RuntimeError(
                    f"every warm-up request to {client.base_url} failed: {first.error_kind} {first.error_detail or ''}"
                )

    async def _run_level(self, client: TargetClient, level: Level, plan: Plan, name: str) -> LevelRun:
        if self.before_level is not None:
            await self.before_level(name, level)
        self.progress.level_started(name, level, plan.requests)
        self.cpu.take()
        if self.slip is not None:
            await self.slip.take()
        return await run_plan(client.send, plan, self.progress.request_done, self.settings.time_scale)

    async def _monitor(self, lag: LoopLagMonitor) -> Monitor:
        loop_lag, cpu = lag.take(), self.cpu.take()
        slip = await self.slip.take() if self.slip is not None else None
        return Monitor(loop_lag, cpu, slip)


def parse_levels(concurrency: str | None, request_rate: str | None) -> tuple[Level, ...]:
    """Levels from `--concurrency 1,2,4` (closed loop) or `--request-rate 1,2,inf` (open loop)."""
    if request_rate is not None:
        rates = [_parse_float(x, "request rate") for x in _split(request_rate)]
        if any(r <= 0 or math.isnan(r) for r in rates):
            raise ValueError("request rates must be positive")
        return tuple(Level(request_rate=r) for r in rates)
    assert concurrency is not None
    levels = [_parse_int(x, "concurrency") for x in _split(concurrency)]
    if any(c < 1 for c in levels):
        raise ValueError("concurrency levels must be at least 1")
    return tuple(Level(concurrency=c) for c in levels)


def parse_trace_levels(time_scales: str) -> tuple[Level, ...]:
    """Levels from `--trace-time-scale 1,0.5` (a trace replayed at each; 0.5 is twice as fast)."""
    scales = [_parse_float(x, "trace time scale") for x in _split(time_scales)]
    if any(not 0 < x < math.inf for x in scales):
        raise ValueError("trace time scales must be positive numbers")
    return tuple(Level(trace_time_scale=x) for x in scales)


def _split(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"expected a comma-separated list, got {text!r}")
    return items


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None


def _parse_float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {text!r}") from None
