"""Reads the simulators' own fidelity figure: how far their step loop ran behind the model.

The simulator exports the accumulated lateness of its steps against the modelled timeline and
the number of steps as Prometheus counters. Their growth during a level gives the mean lateness of
a step, which says whether the simulated GPU kept time while everything shared 2 cores: a mean
lateness that is small against the step time means the modelled latencies were delivered as
modelled (steps run on absolute deadlines, so lateness does not accumulate into the timeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

SLIP_METRIC = "sglang:sim_schedule_slip_seconds"
STEPS_METRIC = "sglang:sim_steps"


class SlipProbe:
    """Reads the slip and step counters from each URL's `/metrics`; `take()` gives their growth."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self._last: dict[str, tuple[float, float] | None] = {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        for url in self.urls:
            self._last[url] = await self._read(url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _read(self, url: str) -> tuple[float, float] | None:
        assert self._session is not None, "use SlipProbe as an async context manager"
        try:
            async with self._session.get(url + "/metrics") as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        slip, steps = counter_sum(text, SLIP_METRIC), counter_sum(text, STEPS_METRIC)
        return None if slip is None or steps is None else (slip, steps)

    async def take(self) -> dict[str, dict[str, float] | None]:
        """Per URL since the last call: slip in ms, steps, and mean lateness per step in ms.

        None where the server exports no slip (not a simulator, or metrics off).
        """
        out: dict[str, dict[str, float] | None] = {}
        for url in self.urls:
            now = await self._read(url)
            before = self._last.get(url)
            self._last[url] = now
            if now is None or before is None:
                out[url] = None
                continue
            slip_ms, steps = (now[0] - before[0]) * 1000.0, now[1] - before[1]
            out[url] = {"slip_ms": slip_ms, "steps": steps, "mean_step_lateness_ms": slip_ms / steps if steps else 0.0}
        return out


def counter_sum(text: str, metric: str) -> float | None:
    """Sum of every sample of counter `metric` (all label sets) in a Prometheus text exposition."""
    base = metric.removesuffix("_total")
    total: float | None = None
    for family in text_string_to_metric_families(text):
        if family.name != base:
            continue
        for sample in family.samples:
            if sample.name in (base, base + "_total"):
                total = (total or 0.0) + sample.value
    return total
