"""Self-checks that the numbers are honest: event-loop lag and CPU use during each level.

On a 2-core machine the load generator, the gateway and the simulators compete for CPU. If the
load generator's event loop runs late, it reads chunks late and inflates latencies; if the
machine is saturated, the simulators' steps run late too. Both are measured per level and put
in the results so a reader can see whether a number measured the server or the machine.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Self

import numpy as np
import psutil


class LoopLagMonitor:
    """Measures how late the event loop wakes a task that asked to sleep `interval` seconds."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self._samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval)
            self._samples.append(time.perf_counter() - before - self.interval)

    def take(self) -> dict[str, float | None]:
        """Lag percentiles in ms since the last call (p50, p99, max), then start a new window."""
        samples, self._samples = self._samples, []
        if not samples:
            return {"p50_ms": None, "p99_ms": None, "max_ms": None}
        ms = np.asarray(samples) * 1000.0
        p50, p99 = np.percentile(ms, (50, 99))
        return {"p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(ms.max())}


@dataclass(frozen=True)
class _Snapshot:
    wall: float
    per_group: dict[str, float]
    system_busy: float
    system_total: float


PidSource = Callable[[], Iterable[int]]


class CpuMeter:
    """CPU used by named groups of processes over a window, and by the whole machine.

    Each group is a function giving its pids now (children come and go). Reported in percent
    of one core, so 200 means both cores of this machine were busy.
    """

    def __init__(self, groups: Mapping[str, PidSource] | None = None) -> None:
        self._groups: dict[str, PidSource] = {"loadgen": lambda: [os.getpid()], **(groups or {})}
        self._last = self._snapshot()

    def _snapshot(self) -> _Snapshot:
        per_group = {name: _cpu_seconds(source()) for name, source in self._groups.items()}
        system = psutil.cpu_times()
        busy = system.user + system.system + getattr(system, "nice", 0.0) + getattr(system, "irq", 0.0) + getattr(system, "softirq", 0.0)
        return _Snapshot(time.perf_counter(), per_group, busy, busy + system.idle + getattr(system, "iowait", 0.0))

    def take(self) -> dict[str, float]:
        """CPU percent of each group and of the whole machine since the last call."""
        now = self._snapshot()
        wall = max(now.wall - self._last.wall, 1e-9)
        out = {
            f"{name}_cpu_pct": 100.0 * max(now.per_group[name] - self._last.per_group.get(name, 0.0), 0.0) / wall
            for name in now.per_group
        }
        total = max(now.system_total - self._last.system_total, 1e-9)
        out["machine_busy_pct"] = 100.0 * (now.system_busy - self._last.system_busy) / total
        out["cores"] = float(psutil.cpu_count() or 1)
        self._last = now
        return out


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of `pid` (empty if it is gone)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the given processes (those that are gone count 0)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
