"""A load level, how many requests it asks for, and what a dataset draws one level's requests from."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from loadtest.workloads.lengths import LengthDist
from loadtest.workloads.text import Text, Words


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
class RateStep:
    """An open-loop level whose rate steps from `low` up to `high` and back, each for `seconds` (requests/s)."""

    low: float
    high: float
    seconds: float

    def __post_init__(self) -> None:
        if not (0 < self.low < math.inf and 0 < self.high < math.inf and 0 < self.seconds < math.inf):
            raise ValueError(f"a rate step's rates and duration must be positive numbers, got {self}")

    @classmethod
    def parse(cls, text: str) -> RateStep:
        """Parse `LOW,HIGH,SECONDS`, e.g. `2,8,30`."""
        parts = [x.strip() for x in text.split(",")]
        try:
            low, high, seconds = (float(x) for x in parts)
        except ValueError:
            raise ValueError(f"a rate step is LOW,HIGH,SECONDS (requests/s, requests/s, s), got {text!r}") from None
        return cls(low, high, seconds)

    @property
    def phases(self) -> tuple[float, float, float]:
        """The rates of its three phases, in order."""
        return self.low, self.high, self.low

    @property
    def requests(self) -> int:
        """Requests the schedule offers over its three phases."""
        return round(sum(self.phases) * self.seconds)

    def __str__(self) -> str:
        return f"{self.low:g},{self.high:g},{self.seconds:g}"


@dataclass(frozen=True)
class Level:
    """One load level: a closed-loop concurrency, an open-loop request rate or rate step, or a trace's time scale."""

    concurrency: int | None = None
    request_rate: float | None = None
    trace_time_scale: float | None = None  # a trace replayed on its own schedule, times multiplied by this
    rate_step: RateStep | None = None

    @property
    def label(self) -> str:
        """The level in a report or progress line: `C=8`, `4/s`, `step 2-8/s x30s` or `trace x0.5`."""
        if self.concurrency is not None:
            return f"C={self.concurrency}"
        if self.trace_time_scale is not None:
            return f"trace x{self.trace_time_scale:g}"
        if self.rate_step is not None:
            step = self.rate_step
            return f"step {step.low:g}-{step.high:g}/s x{step.seconds:g}s"
        # An infinite rate reads back from results.json as None (JSON has no infinity).
        return "inf/s" if self.request_rate is None else f"{self.request_rate:g}/s"


@dataclass(frozen=True)
class Draw:
    """What a dataset draws one level's sessions from: the level, its index, the run's seed and lengths.

    `requests` is what `--requests-per-level` asks of the level; `rng` and `key` give each level
    its own generators and text names, so no level reuses an earlier level's prompts (a server's
    prefix cache would carry them over) while every target gets the same ones.
    """

    level: Level
    index: int
    seed: int
    requests: int
    input_len: int
    output_len: int
    lengths: LengthDist
    burstiness: float = 1.0

    def rng(self, purpose: str) -> random.Random:
        """A generator for one purpose of this level (a string seed is hashed with SHA-512: stable)."""
        return random.Random(f"{purpose}/{self.seed}/{self.index}")

    def key(self, name: str) -> str:
        """The name of a text of this level (see `loadtest.workloads.text.Words`)."""
        return f"{self.seed}/{self.index}/{name}"

    def words(self, name: str, length: int, rng: random.Random) -> Text:
        """The text `name` of this level, its length drawn around `length` (none for 0)."""
        return (Words(self.key(name), self.lengths.draw(rng, length)),) if length else ()
