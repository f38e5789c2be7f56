"""How input and output lengths are drawn around their nominal length L.

- `fixed`: always L.
- `uniform`: uniformly from [R*L, L] (R = `range_ratio`, bench_serving's `--random-range-ratio`).
- `lognormal`: mean L and median `median_ratio` x L (real prompt and answer lengths are skewed:
  most short, a few long), rounded and clipped to [1, `MAX_FACTOR` x L]; at the default ratio of
  0.5 the clip takes under 1% off the mean.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

LengthKind = Literal["fixed", "uniform", "lognormal"]
LENGTH_KINDS: tuple[LengthKind, ...] = ("fixed", "uniform", "lognormal")
MAX_FACTOR = 32


@dataclass(frozen=True)
class LengthDist:
    """A length distribution; `draw` takes one length from a caller's seeded generator."""

    kind: LengthKind = "fixed"
    range_ratio: float = 1.0
    median_ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"length distribution must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}")
        if not 0.0 <= self.range_ratio <= 1.0:
            raise ValueError(f"range ratio must be within [0, 1], got {self.range_ratio}")
        if not 0.0 < self.median_ratio <= 1.0:
            raise ValueError(f"median ratio (median / mean) must be within (0, 1], got {self.median_ratio}")

    @classmethod
    def of(cls, kind: LengthKind | None, range_ratio: float, median_ratio: float = 0.5) -> LengthDist:
        """The distribution the options name; no kind means uniform when R < 1, else fixed (as before the option)."""
        if kind is None:
            kind = "uniform" if range_ratio < 1.0 else "fixed"
        if kind != "uniform" and range_ratio < 1.0:
            raise ValueError(f"a range ratio below 1 draws uniform lengths; it does not apply to {kind} lengths")
        return cls(kind, range_ratio, median_ratio)

    def draw(self, rng: random.Random, length: int) -> int:
        """One length around `length` (at least 1)."""
        if self.kind == "lognormal":
            # mean = exp(mu + sigma^2 / 2) and median = exp(mu) give mu and sigma from the two.
            sigma = math.sqrt(2.0 * math.log(1.0 / self.median_ratio))
            value = rng.lognormvariate(math.log(length * self.median_ratio), sigma)
            return min(max(1, round(value)), MAX_FACTOR * length)
        # Fixed lengths still take their draw, so a seed gives the prompts it gave before this option.
        ratio = self.range_ratio if self.kind == "uniform" else 1.0
        return rng.randint(max(1, int(length * ratio)), length)

    def __str__(self) -> str:
        if self.kind == "uniform":
            return f"uniform in [{self.range_ratio:g} L, L]"
        if self.kind == "lognormal":
            return f"lognormal, median {self.median_ratio:g} x the mean"
        return "fixed"
