"""A sweep: every target at every load level, with the same requests for every target at a level."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from loadtest.client import (
    Endpoint,
    TargetClient,
    TargetOptions,
    open_session,
    served_model,
)
from loadtest.load import closed_loop, open_loop, poisson_arrivals
from loadtest.monitor import CpuMeter, LoopLagMonitor
from loadtest.prompts import PromptFactory
from loadtest.records import LevelRun, RequestRecord, RequestSpec
from loadtest.results import LevelResult, Monitor, TargetResult
from loadtest.slip import SlipProbe
from loadtest.stats import LevelStats, level_stats

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
class RequestsPerLevel:
    """`N` requests per level, or `Nx`: N per concurrency slot (N * C), so every worker sends N.

    `minimum` raises small levels: at low concurrency a handful of requests makes a noisy median
    (an EAGLE request's TPOT varies with its random acceptance draws).
    """

    count: int
    per_slot: bool = False
    minimum: int = 0

    @classmethod
    def parse(cls, text: str, minimum: int = 0) -> RequestsPerLevel:
        """Parse `64` or `4x`."""
        raw = text.strip().lower()
        per_slot = raw.endswith("x")
        digits = raw[:-1] if per_slot else raw
        if not digits.isdigit() or int(digits) < 1:
            raise ValueError(f"requests per level must be a positive integer or 'Nx', got {text!r}")
        return cls(int(digits), per_slot, minimum)

    def for_concurrency(self, concurrency: int) -> int:
        """How many requests a closed-loop level at this concurrency sends."""
        return max(self.count * concurrency if self.per_slot else self.count, self.minimum)

    def __str__(self) -> str:
        text = f"{self.count}x" if self.per_slot else str(self.count)
        return f"{text} (at least {self.minimum})" if self.minimum else text


@dataclass(frozen=True)
class Level:
    """One load level: a closed-loop concurrency or an open-loop request rate."""

    concurrency: int | None = None
    request_rate: float | None = None

    @property
    def label(self) -> str:
        """Short text for progress output: `C=8` or `rate=4/s`."""
        if self.concurrency is not None:
            return f"C={self.concurrency}"
        return f"rate={self.request_rate:g}/s"


@dataclass(frozen=True)
class SweepSettings:
    """Everything that shapes the requests of a sweep."""

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

    def requests_at(self, level: Level) -> int:
        """Number of requests sent at a level."""
        if level.concurrency is not None:
            return self.requests_per_level.for_concurrency(level.concurrency)
        return self.requests_per_level.count

    @property
    def max_connections(self) -> int:
        """Connections the session needs: the highest concurrency (or requests of an open level)."""
        return max(
            (self.requests_at(lv) if lv.concurrency is None else lv.concurrency) for lv in self.levels
        ) + 8


class Progress(Protocol):
    """What the sweep tells whoever shows progress."""

    def level_started(self, target: str, level: Level, total: int) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...

    def level_finished(self, target: str, level: Level, stats: LevelStats) -> None: ...


class Sweep:
    """Runs `settings` against `targets`; `slip` reads simulator schedule slip, `cpu` CPU use."""

    def __init__(
        self,
        targets: Sequence[Target],
        settings: SweepSettings,
        progress: Progress,
        cpu: CpuMeter | None = None,
        slip: SlipProbe | None = None,
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

    def _specs(self, index: int, count: int) -> list[RequestSpec]:
        s = self.settings
        factory = PromptFactory(s.input_len, s.output_len, s.range_ratio, seed=s.seed * 1_000_003 + index)
        return list(factory.take(count))

    async def run(self) -> list[LevelResult]:
        """Run every level against every target, in level order (targets side by side in time)."""
        s = self.settings
        results: list[LevelResult] = []
        async with open_session(s.max_connections, s.timeout) as session:
            clients = await self._clients(session)
            await self._warm_up(clients)
            async with LoopLagMonitor() as lag:
                for index, level in enumerate(s.levels):
                    count = s.requests_at(level)
                    specs = self._specs(index, count)
                    targets: dict[str, TargetResult] = {}
                    for target in self.targets:
                        run = await self._run_level(clients[target.name], level, specs, target.name)
                        stats = level_stats(run)
                        targets[target.name] = TargetResult(stats, await self._monitor(lag))
                        self.progress.level_finished(target.name, level, stats)
                    results.append(LevelResult(level.concurrency, level.request_rate, count, targets))
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

    async def _run_level(self, client: TargetClient, level: Level, specs: list[RequestSpec], name: str) -> LevelRun:
        self.progress.level_started(name, level, len(specs))
        self.cpu.take()
        if self.slip is not None:
            await self.slip.take()
        if level.concurrency is not None:
            return await closed_loop(client.send, specs, level.concurrency, self.progress.request_done)
        assert level.request_rate is not None
        rng = random.Random(self.settings.seed)
        arrivals = poisson_arrivals(level.request_rate, len(specs), rng)
        return await open_loop(client.send, specs, arrivals, self.progress.request_done)

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
