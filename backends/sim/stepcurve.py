"""A decode step's duration as a function of the running batch: a straight line or a measured table.

A profile's role table gives either `t0_ms` and `per_request_ms` (a step with B running requests
takes `t0_ms + per_request_ms * B`) or `step_ms = [[B, ms], ...]`, points measured at increasing
batch sizes. A table is read piecewise-linearly between its points and extended beyond them with
the slope of the nearest end segment; a single point means a constant step time. Since a first
segment's slope extended towards B = 0 (or a falling last one extended upwards) could reach zero,
a table's curve never goes below half its smallest point.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Key prefixes of the step-time models a table can hold: a role table's own (`step_ms`, or `t0_ms`
# and `per_request_ms`), and the adaptive table's fallback to plain decode (`plain_step_ms`, ...).
MODEL_PREFIXES = ("", "plain_")


@dataclass(frozen=True)
class StepCurve:
    """Step time in ms at any batch size: the line `t0 + a * B`, or through the points `(batch, ms)`
    and never below `floor_ms`."""

    points: tuple[tuple[float, float], ...] = ()
    floor_ms: float = 0.0
    line_ms: tuple[float, float] | None = None

    @classmethod
    def line(cls, t0_ms: float, per_request_ms: float) -> StepCurve:
        """The straight line `t0_ms + per_request_ms * B`."""
        return cls(line_ms=(t0_ms, per_request_ms))

    @classmethod
    def table(cls, points: Sequence[Sequence[float]]) -> StepCurve:
        """The piecewise-linear curve through measured `[batch, ms]` points (batches increasing)."""
        if not points:
            raise ValueError("step_ms needs at least one [batch, ms] point")
        pairs = tuple((float(b), float(ms)) for b, ms in points)
        batches = [b for b, _ in pairs]
        if any(b2 <= b1 for b1, b2 in zip(batches, batches[1:], strict=False)):
            raise ValueError(f"step_ms batch sizes must increase, got {[int(b) for b in batches]}")
        return cls(points=pairs, floor_ms=min(ms for _, ms in pairs) / 2.0)

    @classmethod
    def of(cls, t0_ms: float | None, per_request_ms: float | None, table: Sequence[Sequence[float]] | None) -> StepCurve:
        """The curve a role table describes: its `step_ms` table, or its `t0_ms` and `per_request_ms`."""
        if table is not None:
            if t0_ms is not None or per_request_ms is not None:
                raise ValueError("give either step_ms or t0_ms and per_request_ms, not both")
            return cls.table(table)
        if t0_ms is None or per_request_ms is None:
            raise ValueError("give step_ms, or both t0_ms and per_request_ms")
        return cls.line(t0_ms, per_request_ms)

    def at(self, batch: float) -> float:
        """Step time at `batch` running requests, ms."""
        if self.line_ms is not None:
            return self.line_ms[0] + self.line_ms[1] * batch
        if len(self.points) == 1:
            return self.points[0][1]
        i = min(max(bisect_right([b for b, _ in self.points], batch) - 1, 0), len(self.points) - 2)
        (b0, ms0), (b1, ms1) = self.points[i], self.points[i + 1]
        return max(ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0), self.floor_ms)


def curve_from_keys(table: dict[str, Any], prefix: str = "") -> StepCurve:
    """The curve described by the raw (unvalidated) keys of a profile table, under a key prefix."""
    return StepCurve.of(table.get(f"{prefix}t0_ms"), table.get(f"{prefix}per_request_ms"), table.get(f"{prefix}step_ms"))


def without_replaced_model(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` less the step-time model keys that `override` replaces.

    A file or an `[adaptive]` table that gives a step-time model in one form replaces the model of
    the table it is laid over, whichever form that one used: a `step_ms` table drops the base's
    `t0_ms` and `per_request_ms`, and either of those drops the base's `step_ms`.
    """
    out = dict(base)
    for prefix in MODEL_PREFIXES:
        table_key, line_keys = f"{prefix}step_ms", (f"{prefix}t0_ms", f"{prefix}per_request_ms")
        if table_key in override:
            for key in line_keys:
                out.pop(key, None)
        if any(key in override for key in line_keys):
            out.pop(table_key, None)
    return out
