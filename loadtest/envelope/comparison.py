"""The envelope's judgement: per level, the subject target against the best of its baselines, and the bounds.

throughput_ratio = subject output tok/s / the best baseline's; tpot_ratio = subject TPOT p50 / the
best baseline's, where, for a comparison with `carrying_within` (the same-hardware one), only the
baselines that carry the load compete on TPOT: those within that share of the best throughput. A
capped EAGLE server that queues the rest shows a good TPOT for the requests it runs while its TTFT
explodes; it must not set the TPOT bar at a load it does not carry. Which target is the subject
and which are baselines comes with the results (`Comparison`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from loadtest.report import fixed, share_text
from loadtest.results import LevelResult, ResultsDocument
from loadtest.verdicts import BoundCheck, Comparison, EnvelopeVerdict

# What files written before results recorded their comparison compared: specgate against its two servers.
LEGACY_COMPARISON = Comparison("specgate", ("eagle", "plain"))
# The same-hardware rule: a baseline carries the load when its throughput is within 10% of the best.
CARRYING_WITHIN = 0.10


@dataclass(frozen=True)
class Bound:
    """A bound the envelope is checked against: a per-level ratio key, `>=` or `<=` a value."""

    name: str
    op: Literal[">=", "<="]
    value: float

    def holds(self, ratio: float | None) -> bool:
        """Whether a level's ratio satisfies the bound (a missing ratio does not)."""
        if ratio is None:
            return False
        return ratio >= self.value if self.op == ">=" else ratio <= self.value

    def check(self, levels: Sequence[LevelResult]) -> BoundCheck:
        """The bound over every level: met only if every level measured the ratio and it held."""
        measured = [(r, lv.concurrency) for lv in levels if (r := lv.ratios.get(self.name)) is not None]
        pick = min if self.op == ">=" else max
        worst, worst_at = pick(measured, key=lambda rc: rc[0]) if measured else (None, None)
        met = len(measured) == len(levels) and all(self.holds(r) for r, _ in measured)
        return BoundCheck(self.name, self.op, self.value, met, worst, worst_at)


@dataclass(frozen=True)
class Best:
    """The baselines a level's ratios were taken against (None where no baseline measured it)."""

    throughput: str | None
    tpot: str | None


def best_baselines(level: LevelResult, comparison: Comparison) -> Best:
    """The highest-throughput baseline, and the lowest TPOT p50 among those that carry the load."""
    t = level.targets
    tput = {n: t[n].stats.output_tok_s for n in comparison.baselines}
    best_tp = max(tput, key=lambda n: tput[n]) if tput else None
    if comparison.carrying_within is None or best_tp is None:
        carrying = list(comparison.baselines)
    else:
        floor = (1.0 - comparison.carrying_within) * tput[best_tp]
        carrying = [n for n in comparison.baselines if tput[n] >= floor]
    tpots = {n: p for n in carrying if (p := t[n].stats.tpot.p50) is not None}
    return Best(best_tp, min(tpots, key=lambda n: tpots[n]) if tpots else None)


def level_ratios(level: LevelResult, comparison: Comparison) -> dict[str, float | None]:
    """The level's `throughput_ratio` and `tpot_ratio` of the subject against its best baselines."""
    t = level.targets
    subject = t[comparison.subject].stats
    best = best_baselines(level, comparison)
    best_tp = t[best.throughput].stats.output_tok_s if best.throughput is not None else 0.0
    best_tpot = t[best.tpot].stats.tpot.p50 if best.tpot is not None else None
    return {
        "throughput_ratio": subject.output_tok_s / best_tp if best_tp > 0 else None,
        "tpot_ratio": subject.tpot.p50 / best_tpot if best_tpot and subject.tpot.p50 is not None else None,
    }


def add_ratios(doc: ResultsDocument, comparison: Comparison, bounds: Sequence[Bound]) -> ResultsDocument:
    """`doc` with each level's ratios (and the baselines they were taken against) and the verdict over `bounds`."""
    levels = tuple(
        replace(lv, ratios={**lv.ratios, **level_ratios(lv, comparison)}, best=_best_json(lv, comparison))
        for lv in doc.levels
    )
    return replace(doc, levels=levels, envelope=EnvelopeVerdict(tuple(b.check(levels) for b in bounds), comparison))


def _best_json(level: LevelResult, comparison: Comparison) -> dict[str, str | None]:
    best = best_baselines(level, comparison)
    return {"throughput": best.throughput, "tpot": best.tpot}


def check_text(check: BoundCheck, met: str = "met", not_met: str = "NOT met") -> str:
    """`throughput_ratio >= 0.95: met (worst 0.981 at C=4)`."""
    worst = "-" if check.worst is None else f"{check.worst:.3f}"
    return f"{check.name} {check.op} {check.bound}: {met if check.met else not_met} (worst {worst} at C={check.worst_at})"


def envelope_markdown(doc: ResultsDocument) -> list[str]:
    """report.md's envelope section: the ratios per level, and whether the requested bounds held."""
    assert doc.envelope is not None, "add_ratios first"
    comparison = doc.envelope.comparison or LEGACY_COMPARISON
    subject, baselines = comparison.subject, comparison.baselines
    names = ", ".join(baselines)
    lines = ["## Envelope", ""]
    if comparison.carrying_within is None:
        better = "better"
        lines += [
            f"Throughput ratio = {subject} output tok/s / max({names}); TPOT ratio = {subject} TPOT p50 / min({names}).",
            "",
        ]
    else:
        better = "best"
        lines += [
            f"Same hardware: {subject} against {names}, each run on the same GPUs. Throughput ratio = {subject} "
            f"output tok/s / the best baseline's; TPOT ratio = {subject} TPOT p50 / the lowest TPOT p50 among the "
            f"baselines that carry the load (output tok/s within {comparison.carrying_within:.0%} of the best).",
            "",
        ]
    lines += [
        f"| concurrency | {better} throughput | throughput ratio | {better} TPOT p50 | TPOT ratio | {subject} share |",
        "|---|---|---|---|---|---|",
    ]
    for level in doc.levels:
        t = level.targets
        best = best_baselines(level, comparison)
        tp = "-" if best.throughput is None else f"{best.throughput} {t[best.throughput].stats.output_tok_s:.1f}"
        tpot = "-" if best.tpot is None else f"{best.tpot} {fixed(t[best.tpot].stats.tpot.p50, 2)}"
        lines.append(
            f"| {level.concurrency} | {tp} | {fixed(level.ratios.get('throughput_ratio'), 3)} | "
            f"{tpot} | {fixed(level.ratios.get('tpot_ratio'), 3)} | "
            f"{share_text(t[subject].stats.backend_share)} |"
        )
    lines.append("")
    lines += [f"- {check_text(check)}" for check in doc.envelope.checks]
    if doc.envelope.checks:
        lines.append("")
    return lines
