"""The envelope's judgement: per level, the subject target against the best of its baselines, and the bounds.

throughput_ratio = subject output tok/s / the best baseline's; tpot_ratio = subject TPOT p50 / the
best baseline's. Which target is the subject and which are baselines comes with the results
(`Comparison`), so a harness with other targets (K-group servers, say) reuses all of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from loadtest.report import fixed, share_text
from loadtest.results import BoundCheck, Comparison, EnvelopeVerdict, LevelResult, ResultsDocument

# What files written before results recorded their comparison compared: specgate against its two servers.
LEGACY_COMPARISON = Comparison("specgate", ("eagle", "plain"))


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


def level_ratios(level: LevelResult, comparison: Comparison) -> dict[str, float | None]:
    """The level's `throughput_ratio` and `tpot_ratio` of the subject against its best baseline."""
    t = level.targets
    subject = t[comparison.subject]
    best_tp = max(t[n].stats.output_tok_s for n in comparison.baselines)
    tpots = [p for n in comparison.baselines if (p := t[n].stats.tpot.p50) is not None]
    return {
        "throughput_ratio": subject.stats.output_tok_s / best_tp if best_tp > 0 else None,
        "tpot_ratio": subject.stats.tpot.p50 / min(tpots) if tpots and subject.stats.tpot.p50 is not None else None,
    }


def add_ratios(doc: ResultsDocument, comparison: Comparison, bounds: Sequence[Bound]) -> ResultsDocument:
    """`doc` with each level's ratios and the envelope verdict over `bounds` (`doc.envelope.all_met`)."""
    levels = tuple(replace(lv, ratios={**lv.ratios, **level_ratios(lv, comparison)}) for lv in doc.levels)
    return replace(doc, levels=levels, envelope=EnvelopeVerdict(tuple(b.check(levels) for b in bounds), comparison))


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
    lines += [
        f"Throughput ratio = {subject} output tok/s / max({names}); TPOT ratio = {subject} TPOT p50 / min({names}).",
        "",
        f"| concurrency | better throughput | throughput ratio | better TPOT p50 | TPOT ratio | {subject} share |",
        "|---|---|---|---|---|---|",
    ]
    for level in doc.levels:
        t = level.targets
        best_tp = max(baselines, key=lambda n: t[n].stats.output_tok_s)
        tpots = {n: p for n in baselines if (p := t[n].stats.tpot.p50) is not None}
        best_tpot = min(tpots, key=lambda n: tpots[n]) if tpots else "-"
        lines.append(
            f"| {level.concurrency} | {best_tp} {t[best_tp].stats.output_tok_s:.1f} | {fixed(level.ratios.get('throughput_ratio'), 3)} | "
            f"{best_tpot} {fixed(tpots.get(best_tpot), 2)} | {fixed(level.ratios.get('tpot_ratio'), 3)} | "
            f"{share_text(t[subject].stats.backend_share)} |"
        )
    lines.append("")
    lines += [f"- {check_text(check)}" for check in doc.envelope.checks]
    if doc.envelope.checks:
        lines.append("")
    return lines
