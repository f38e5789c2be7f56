"""Two family sweeps side by side: what a change (or another seed) did to every cell's verdict and ratios.

A pair is the `--out` JSON of `python -m vnode family` before and after; several pairs (one per seed)
are pooled. Per pair: cells meeting every bound before and after, and the cells whose verdict
changed. Over every pair: each worst-level ratio's change, oriented so that above 1 is better (a
throughput ratio after / before, a latency ratio before / after), counted better or worse where it
moved by more than `threshold`, its geometric mean per workload and bound, and the largest moves.
Failed requests are not a ratio: a change in their count is listed on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from loadtest.envelope.comparison import FAILED
from loadtest.verdicts import BoundCheck
from vnode.family_sweep import Cell

THRESHOLD = 0.02  # a ratio moved by more than this share counts as better or worse
LARGE = 0.05  # a ratio moved by more than this share is listed


def load_cells(path: Path) -> list[Cell]:
    """The cells of a family sweep's `--out` JSON."""
    raw = orjson.loads(path.read_bytes())
    return [Cell(c["member"], c["workload"], tuple(BoundCheck.from_json(k) for k in c["checks"]), c["seconds"])
            for c in raw["cells"]]


@dataclass(frozen=True)
class Move:
    """One bound's worst-level ratio in one cell of one pair, before and after."""

    pair: int
    member: str
    workload: str
    bound: str
    before: float
    after: float
    change: float  # above 1: better

    def text(self) -> str:
        return f"{self.member} {self.workload} {self.bound}: {self.before:.3f} -> {self.after:.3f}"


@dataclass(frozen=True)
class PairVerdicts:
    """One pair's cells meeting every bound before and after, and the cells that changed verdict."""

    met_before: int
    met_after: int
    compared: int  # cells present in both sweeps
    gained: tuple[tuple[str, str], ...]  # (member, workload) met after only
    lost: tuple[tuple[str, str], ...]
    failed: tuple[str, ...]  # cells whose count of failed requests changed, as text
    unmatched: int  # cells in one sweep only


@dataclass(frozen=True)
class FamilyComparison:
    """Every pair's verdicts and every ratio's move, pooled."""

    pairs: tuple[PairVerdicts, ...]
    moves: tuple[Move, ...]
    threshold: float

    @property
    def better(self) -> int:
        return sum(1 for m in self.moves if m.change > 1.0 + self.threshold)

    @property
    def worse(self) -> int:
        return sum(1 for m in self.moves if m.change < 1.0 / (1.0 + self.threshold))

    def geometric_means(self) -> dict[tuple[str, str], float]:
        """Per (workload, bound), in the order first met: the geometric mean of the ratios' changes."""
        logs: dict[tuple[str, str], list[float]] = {}
        for m in self.moves:
            logs.setdefault((m.workload, m.bound), []).append(math.log(m.change))
        return {key: math.exp(sum(values) / len(values)) for key, values in logs.items()}

    def largest(self, share: float = LARGE) -> list[Move]:
        """The moves beyond `share` either way, the largest first."""
        big = [m for m in self.moves if abs(math.log(m.change)) > math.log1p(share)]
        return sorted(big, key=lambda m: -abs(math.log(m.change)))


def _change(check: BoundCheck, before: float, after: float) -> float:
    """`after` against `before`, above 1 where it is better for the bound's direction."""
    return after / before if check.op == ">=" else before / after


def compare(pairs: Sequence[tuple[Sequence[Cell], Sequence[Cell]]], threshold: float = THRESHOLD) -> FamilyComparison:
    """Compare each (before, after) pair of sweeps cell by cell (cells are matched by member and workload)."""
    verdicts: list[PairVerdicts] = []
    moves: list[Move] = []
    for index, (before, after) in enumerate(pairs):
        old = {(c.member, c.workload): c for c in before}
        new = {(c.member, c.workload): c for c in after}
        common = [key for key in old if key in new]
        gained, lost, failed = [], [], []
        for key in common:
            a, b = old[key], new[key]
            if a.failed and not b.failed:
                gained.append(key)
            elif b.failed and not a.failed:
                lost.append(key)
            for x, y in zip(a.checks, b.checks, strict=False):
                if x.name != y.name:
                    continue
                if x.name == FAILED:
                    if x.worst != y.worst:
                        failed.append(f"{key[0]} {key[1]}: failed requests {x.worst} -> {y.worst}")
                    continue
                if x.worst is None or y.worst is None or x.worst <= 0.0 or y.worst <= 0.0:
                    continue
                moves.append(Move(index, key[0], key[1], x.name, x.worst, y.worst, _change(x, x.worst, y.worst)))
        verdicts.append(PairVerdicts(
            sum(1 for key in common if not old[key].failed), sum(1 for key in common if not new[key].failed),
            len(common), tuple(gained), tuple(lost), tuple(failed), len(old) + len(new) - 2 * len(common),
        ))
    return FamilyComparison(tuple(verdicts), tuple(moves), threshold)


def comparison_lines(comparison: FamilyComparison, names: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The comparison in words: per pair its verdicts, then the pooled ratios (Markdown list items)."""
    lines: list[str] = []
    for index, pair in enumerate(comparison.pairs):
        label = f"{names[index][0]} -> {names[index][1]}" if index < len(names) else f"pair {index + 1}"
        lines.append(f"- {label}: {pair.met_before} -> {pair.met_after} of {pair.compared} cells meet every bound"
                     + (f" ({pair.unmatched} cells in one sweep only, not compared)" if pair.unmatched else ""))
        lines += [f"  - met: {m} {w}" for m, w in pair.gained]
        lines += [f"  - lost: {m} {w}" for m, w in pair.lost]
        lines += [f"  - {text}" for text in pair.failed]
    share = f"{comparison.threshold:.0%}"
    lines.append(f"- worst-level ratios better by over {share}: {comparison.better}, worse by over {share}: "
                 f"{comparison.worse} (of {len(comparison.moves)})")
    lines.append("- geometric mean of each ratio's change (above 1: better):")
    lines += [f"  - {workload} {bound}: {mean:.4f}" for (workload, bound), mean in comparison.geometric_means().items()]
    largest = comparison.largest()
    if largest:
        lines.append(f"- moved by over {LARGE:.0%}:")
        multi = len(comparison.pairs) > 1
        lines += [f"  - {m.text()}" + (f" (pair {m.pair + 1})" if multi else "") for m in largest]
    return lines
