"""A family of synthetic profiles: where EAGLE stops paying (the crossover), by how much it wins alone
(the speed-up), the step curves' shape and the GPU groups, each dialled in on purpose.

A member is the measured `h200-llama8b` profile (one H200 per group: memory, caps, prefill) with
new step curves laid over it in the profile format (`backends/sim/profiles.py`). The plain step is
the measured table (`table`: flat, then bending up as the batch turns compute-bound) or the straight
line through its ends (`line`). EAGLE (tau 3, 4 draft tokens) steps in `tau / speedup` times the
plain step plus `d * (B - 1)`: a lone request decodes `speedup` times faster, and each further
request costs EAGLE `d` more than it would cost plain, `d` solved so that the two throughputs cross
at `crossover - 0.5`. `Profile.crossover_batch()` (the first batch at which plain is at least as
fast) is then exactly `crossover`, and the EAGLE curve has the plain one's shape (`line`: a line;
`table`: a table on the same batches). Crossover 1 means EAGLE never pays: `d = 0` and a speed-up
below 1. Plain must gain the speed-up in throughput by the crossover, so small crossovers allow
only small speed-ups: a member is `feasible` when EAGLE's throughput still grows (never falls) with
its batch up to the EAGLE cap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from backends.sim.profiles import Profile, load_profile
from backends.sim.stepcurve import StepCurve

BASE_PROFILE = "h200-llama8b"
TAU, DRAFT_TOKENS = 3.0, 4
EAGLE_CAP = 128  # the adaptive policy's default cap: what specgate's and eagle-dp's EAGLE servers run
BEYOND_CAP = 512  # a crossover past any batch an EAGLE server runs
CROSSOVERS = (1, 2, 4, 8, 16, 32, 64, 128, BEYOND_CAP)
SPEEDUPS = (1.2, 1.5, 2.0, 3.0)
NEVER_PAYS = 0.9  # the speed-up of a crossover-1 member: EAGLE is slower even alone
CURVES = ("line", "table")
GROUPS = (1, 2, 4, 8)

Curve = Literal["line", "table"]


@dataclass(frozen=True)
class Member:
    """One synthetic profile: its crossover (per group), speed-up at one request, curve shape and K groups."""

    crossover: int
    speedup: float
    curve: Curve
    groups: int

    @property
    def name(self) -> str:
        """`x16-s2-line-k2`: crossover, speed-up, curve, groups."""
        return f"x{self.crossover}-s{self.speedup:g}-{self.curve}-k{self.groups}"

    @classmethod
    def parse(cls, name: str) -> Member:
        """The member `name` names (raises ValueError for a name that is not one)."""
        try:
            x, s, curve, k = name.split("-")
            if not (x[0] == "x" and s[0] == "s" and k[0] == "k" and curve in CURVES):
                raise ValueError
            member = cls(int(x[1:]), float(s[1:]), curve, int(k[1:]))  # type: ignore[arg-type]
        except (ValueError, IndexError):
            raise ValueError(f"a member is named like x16-s2-line-k2 (crossover, speed-up, {'|'.join(CURVES)}, "
                             f"groups), got {name!r}") from None
        if not member.feasible:
            raise ValueError(f"member {name}: no step curves give that crossover with that speed-up")
        return member

    @property
    def feasible(self) -> bool:
        """Whether the curves exist: crossover 1 with a speed-up below 1, else a speed-up above 1 for which
        EAGLE's throughput does not fall as its batch grows, up to the EAGLE cap."""
        if self.crossover < 1 or self.groups < 1 or self.speedup <= 0:
            return False
        if (self.crossover == 1) != (self.speedup < 1.0):
            return False
        eagle = self._eagle_curve
        rates = [b / eagle.at(b) for b in range(1, EAGLE_CAP + 1)]
        return eagle.at(0) > 0 and all(later >= earlier for earlier, later in zip(rates, rates[1:]))

    def overrides(self) -> dict[str, Any]:
        """The member's keys in the profile format, laid over `BASE_PROFILE`."""
        scale, d = self._eagle_terms
        plain = _base_plain()
        if self.curve == "line":
            t0, per_request = _chord(plain)
            eagle: dict[str, Any] = {"t0_ms": scale * t0 - d, "per_request_ms": scale * per_request + d}
            plain_keys: dict[str, Any] = {"t0_ms": t0, "per_request_ms": per_request}
        else:
            eagle = {"step_ms": [[b, scale * ms + d * (b - 1)] for b, ms in plain]}
            plain_keys = {}
        return {"name": self.name, "plain": plain_keys, "eagle": {**eagle, "tau": TAU, "num_draft_tokens": DRAFT_TOKENS}}

    def write(self, directory: Path) -> Path:
        """The member as a profile file (JSON) in `directory`, for `--profile h200-llama8b --profile-file`."""
        path = directory / f"{self.name}.json"
        path.write_text(json.dumps(self.overrides(), indent=1))
        return path

    def profile(self) -> Profile:
        """The member's whole profile."""
        return load_profile(BASE_PROFILE, overrides=self.overrides())

    @cached_property
    def _plain_curve(self) -> StepCurve:
        plain = _base_plain()
        return StepCurve.line(*_chord(plain)) if self.curve == "line" else StepCurve.table(plain)

    @cached_property
    def _eagle_terms(self) -> tuple[float, float]:
        """(tau / speedup, d): EAGLE's step is `tau / speedup * plain(B) + d * (B - 1)`."""
        plain, scale = self._plain_curve, TAU / self.speedup
        if self.crossover == 1:
            return scale, 0.0
        cross = self.crossover - 0.5
        return scale, (TAU - scale) * plain.at(cross) / (cross - 1.0)

    @cached_property
    def _eagle_curve(self) -> StepCurve:
        keys = self.overrides()["eagle"]
        return StepCurve.of(keys.get("t0_ms"), keys.get("per_request_ms"), keys.get("step_ms"))


def _base_plain() -> list[list[float]]:
    table = load_profile(BASE_PROFILE).plain.step_table
    assert table is not None, f"{BASE_PROFILE}'s plain step is a measured table"
    return [[float(b), float(ms)] for b, ms in table]


def _chord(table: list[list[float]]) -> tuple[float, float]:
    """(t0, per request) of the line through a table's first and last points."""
    (b0, ms0), (b1, ms1) = table[0], table[-1]
    slope = (ms1 - ms0) / (b1 - b0)
    return ms0 - slope * b0, slope


def members(crossovers: tuple[int, ...] = CROSSOVERS, speedups: tuple[float, ...] = SPEEDUPS,
            curves: tuple[Curve, ...] = CURVES, groups: tuple[int, ...] = GROUPS) -> list[Member]:
    """Every feasible member of the grid (crossover 1 with its one speed-up below 1), in grid order."""
    out = []
    for x in crossovers:
        for s in (NEVER_PAYS,) if x == 1 else speedups:
            for curve in curves:
                for k in groups:
                    member = Member(x, s, curve, k)
                    if member.feasible:
                        out.append(member)
    return out


def family() -> list[Member]:
    """The family the sweep runs by default: every axis at each of its values, crossed where it matters.

    Crossover by speed-up on lines with 2 groups (every crossover with 1.5x and 3x where feasible,
    1.2x at crossover 2, 0.9x at 1; the whole speed-up range at crossover 16), the measured bent
    curve at three crossovers, and 1, 2, 4 and 8 groups at an early and a late crossover. The whole
    grid (`members()`) is 240 members; this is 29, so the sweep runs in about a minute on 2 cores.
    """
    names = [Member(1, NEVER_PAYS, "line", 2), Member(2, 1.2, "line", 2)]
    names += [Member(x, s, "line", 2) for x in CROSSOVERS[2:] for s in (1.5, 3.0)]
    names += [Member(16, s, "line", 2) for s in (1.2, 2.0)]
    names += [Member(x, 2.0, "table", 2) for x in (4, 16, 128)]
    names += [Member(x, 2.0, "line", k) for x in (4, 32) for k in GROUPS]
    assert all(m.feasible for m in names)
    return names
