"""The envelope's judgement: per level, the subject target against the best of its baselines, and the bounds.

throughput_ratio = subject output tok/s / the best baseline's; tpot_ratio = subject TPOT p50 / the
best baseline's, where, for a comparison with `carrying_within` (the same-hardware one), only the
baselines that carry the load compete on TPOT: those within that share of the best throughput. A
capped EAGLE server that queues the rest shows a good TPOT for the requests it runs while its TTFT
explodes; it must not set the TPOT bar at a load it does not carry. ttft_p50_ratio, e2e_p50_ratio
and e2e_p99_ratio compare the same way (against the lowest among the baselines that carry the
load); failed_requests counts every target's failed requests at the level (a level where any
target failed some is no like-for-like comparison). Which target is the subject and which are
baselines comes with the results (`Comparison`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal

from loadtest.report import fixed, share_text
from loadtest.results import LevelResult, ResultsDocument
from loadtest.stats import LevelStats
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
        measured = [(r, lv) for lv in levels if (r := lv.ratios.get(self.name)) is not None]
        met = len(measured) == len(levels) and all(self.holds(r) for r, _ in measured)
        if not measured:
            return BoundCheck(self.name, self.op, self.value, met, None, None)
        worst, level = (min if self.op == ">=" else max)(measured, key=lambda rl: rl[0])
        return BoundCheck(self.name, self.op, self.value, met, worst, level.x, level.label)


@dataclass(frozen=True)
class LatencyRatio:
    """A latency compared against the lowest carrying baseline's: its ratio key, its `Best` field, its header."""

    key: str
    best: str
    metric: Callable[[LevelStats], float | None]
    header: str


LATENCY_RATIOS = (
    LatencyRatio("tpot_ratio", "tpot", lambda st: st.tpot.p50, "TPOT ratio"),
    LatencyRatio("ttft_p50_ratio", "ttft", lambda st: st.ttft.p50, "TTFT p50 ratio"),
    LatencyRatio("e2e_p50_ratio", "e2e_p50", lambda st: st.e2e.p50, "E2E p50 ratio"),
    LatencyRatio("e2e_p99_ratio", "e2e_p99", lambda st: st.e2e.p99, "E2E p99 ratio"),
)
FAILED = "failed_requests"


@dataclass(frozen=True)
class Best:
    """The baselines a level's ratios were taken against (None where no baseline measured it)."""

    throughput: str | None
    tpot: str | None
    ttft: str | None = None
    e2e_p50: str | None = None
    e2e_p99: str | None = None


def best_baselines(level: LevelResult, comparison: Comparison) -> Best:
    """The highest-throughput baseline, and the lowest of each latency among those that carry the load."""
    t = level.targets
    tput = {n: t[n].stats.output_tok_s for n in comparison.baselines}
    best_tp = max(tput, key=lambda n: tput[n]) if tput else None
    if comparison.carrying_within is None or best_tp is None:
        carrying = list(comparison.baselines)
    else:
        floor = (1.0 - comparison.carrying_within) * tput[best_tp]
        carrying = [n for n in comparison.baselines if tput[n] >= floor]
    lowest: dict[str, str | None] = {}
    for ratio in LATENCY_RATIOS:
        values = {n: v for n in carrying if (v := ratio.metric(t[n].stats)) is not None}
        lowest[ratio.best] = min(values, key=lambda n: values[n]) if values else None
    return Best(best_tp, **lowest)


def level_ratios(level: LevelResult, comparison: Comparison) -> dict[str, float | None]:
    """The level's ratios of the subject against its best baselines, and its failed requests."""
    t = level.targets
    subject = t[comparison.subject].stats
    best = best_baselines(level, comparison)
    best_tp = t[best.throughput].stats.output_tok_s if best.throughput is not None else 0.0
    ratios: dict[str, float | None] = {"throughput_ratio": subject.output_tok_s / best_tp if best_tp > 0 else None}
    for ratio in LATENCY_RATIOS:
        name = getattr(best, ratio.best)
        bar = ratio.metric(t[name].stats) if name is not None else None
        mine = ratio.metric(subject)
        ratios[ratio.key] = mine / bar if bar and mine is not None else None
    ratios[FAILED] = sum(r.stats.failed for r in t.values())
    return ratios


def add_ratios(doc: ResultsDocument, comparison: Comparison, bounds: Sequence[Bound]) -> ResultsDocument:
    """`doc` with each level's ratios (and the baselines they were taken against) and the verdict over `bounds`."""
    levels = tuple(
        replace(lv, ratios={**lv.ratios, **level_ratios(lv, comparison)}, best=_best_json(lv, comparison))
        for lv in doc.levels
    )
    return replace(doc, levels=levels, envelope=EnvelopeVerdict(tuple(b.check(levels) for b in bounds), comparison))


def _best_json(level: LevelResult, comparison: Comparison) -> dict[str, str | None]:
    return asdict(best_baselines(level, comparison))


def check_text(check: BoundCheck, met: str = "met", not_met: str = "NOT met") -> str:
    """`throughput_ratio >= 0.95: met (worst 0.981 at C=4)`."""
    worst = "-" if check.worst is None else f"{check.worst:.0f}" if check.name == FAILED else f"{check.worst:.3f}"
    return f"{check.name} {check.op} {check.bound}: {met if check.met else not_met} (worst {worst} at {check.where})"


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
    closed = doc.mode == "closed-loop"
    # Files written before the other latency ratios and the failure counts have none of their columns.
    headers = {r.key: r.header for r in LATENCY_RATIOS[1:]} | {FAILED: "failed requests"}
    extra = [key for key in headers if key in doc.levels[0].ratios]
    if extra:
        lines += [
            f"TTFT p50, E2E p50 and E2E p99 ratios: {subject}'s against the lowest of the baselines that "
            + ("carry the load" if comparison.carrying_within is not None else "ran") + "; failed requests: every "
            "target's at the level (where some failed, the targets did not serve the same requests).",
            "",
        ]
    lines += [
        f"| {'concurrency' if closed else 'level'} | {better} throughput | throughput ratio | {better} TPOT p50 | TPOT ratio | "
        + "".join(f"{headers[key]} | " for key in extra) + f"{subject} share |",
        "|---|---|---|---|---|---|" + "---|" * len(extra),
    ]
    for level in doc.levels:
        t = level.targets
        best = best_baselines(level, comparison)
        tp = "-" if best.throughput is None else f"{best.throughput} {t[best.throughput].stats.output_tok_s:.1f}"
        tpot = "-" if best.tpot is None else f"{best.tpot} {fixed(t[best.tpot].stats.tpot.p50, 2)}"
        cells = [str(level.ratios[key]) if key == FAILED else fixed(level.ratios.get(key), 3) for key in extra]
        lines.append(
            f"| {level.concurrency if closed else level.label} | {tp} | {fixed(level.ratios.get('throughput_ratio'), 3)} | "
            f"{tpot} | {fixed(level.ratios.get('tpot_ratio'), 3)} | " + "".join(f"{c} | " for c in cells)
            + f"{share_text(t[subject].stats.backend_share)} |"
        )
    lines.append("")
    lines += [f"- {check_text(check)}" for check in doc.envelope.checks]
    if doc.envelope.checks:
        lines.append("")
    return lines
