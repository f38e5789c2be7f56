"""`specgate plan` for a workload: candidate node layouts evaluated in virtual time under the real policy, ranked.

A candidate is K groups of G GPUs (G divides the node's GPUs), each co-located group's memory split
(EAGLE's share of the KV room the two copies leave, `backends.resolve.memory_split`), and how many
groups (the last ones) run a plain server alone and how many (those before) an EAGLE server alone. Each is the specgate target of the same-hardware
envelope (`vnode.targets`, from the launch plan of the generated config, so the launcher's own
memory check refuses what cannot hold the model); the baselines (plain-dp, eagle-dp, adaptive-dp)
run on every grouping that holds the model, and a candidate's ratios at a level are taken against
the best of them all: the best way to run the node's GPUs in one mode. Every sweep gets the same
plans and, by default, each request's own acceptance draws (`vnode.draws`), so candidates that
route alike tie exactly instead of by luck.

Rank: the worst level's throughput ratio (higher first), then the worst TPOT p50 ratio, then the
worst E2E p99 ratio (lower first); ratios within `BAND` of each other count as equal, and equal
candidates keep their order, the launcher's default split first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends.resolve import memory_split, request_kv_gb
from backends.sim.layout import ServerSlot, plan_layout
from backends.sim.profiles import Profile
from gateway.config import PolicyConfig
from loadtest.envelope.comparison import CARRYING_WITHIN, level_ratios
from loadtest.envelope.fair import SUBJECT, Hardware
from loadtest.envelope.planned import PlannedLayout, PredictedLevel
from loadtest.envelope.timescale import profile_for
from loadtest.results import LevelResult, Monitor, TargetResult
from loadtest.stats import LevelStats
from loadtest.sweep import SweepSettings
from loadtest.verdicts import Comparison
from loadtest.workloads.lengths import LengthDist
from vnode.envelope import CHAT_TEMPLATE_TOKENS, QuietProgress, level_plans, sweep_target
from vnode.targets import Draws, TargetSpec, same_hardware_targets

# The launcher's even split first; then EAGLE at three quarters of the KV room, for traffic that speculates under
# load; then plain at 0.7 of it, for traffic that decodes plain under load and leaves EAGLE's room idle.
DEFAULT_KV_SHARES = (0.5, 0.75, 0.3)
BAND = 0.01  # ratios this close rank as equal (a few requests per level move them about that much)
BASELINES = ("plain-dp", "eagle-dp", "adaptive-dp")
_NO_MONITOR = Monitor({}, {})


@dataclass(frozen=True)
class PlanSpec:
    """What to plan for: the profile, the node's GPUs, the traffic (a sweep's settings), the policy, the splits."""

    profile: str | None
    profile_file: Path | None
    gpus: int
    settings: SweepSettings
    policy: str = PolicyConfig().name
    policy_params: tuple[tuple[str, Any], ...] = ()
    kv_shares: tuple[float, ...] = DEFAULT_KV_SHARES
    draws: Draws = "request"
    longest_request_tokens: int | None = None  # a co-located plain server's KV floor; None: the context length


@dataclass(frozen=True)
class Candidate:
    """One layout: its hardware (memory shares resolved) and EAGLE's share of the KV room it was split by."""

    hardware: Hardware
    kv_share: float

    @property
    def name(self) -> str:
        """`8x1 kv0.5`, `4x2 kv0.5 +2 plain-only`, `8x1 +6 EAGLE-only +2 plain-only`: unique within a plan."""
        h = self.hardware
        split = f" kv{self.kv_share:g}" if h.colocated_groups else ""
        mix = f" +{h.eagle_only_groups} EAGLE-only" if h.eagle_only_groups else ""
        mix += f" +{h.plain_only_groups} plain-only" if h.plain_only_groups else ""
        return f"{h.groups}x{h.gpus_per_group}{split}{mix}"

    def describe(self) -> str:
        """The layout in words: groups, memory split, one-mode groups."""
        h = self.hardware
        split = (f"EAGLE's KV share {self.kv_share:g}: no room" if h.eagle_mem_fraction is None or h.plain_mem_fraction is None
                 else f"EAGLE {h.eagle_mem_fraction:g} / plain {h.plain_mem_fraction:g}")
        parts = [f"{h.colocated_groups} co-located ({split})"] if h.colocated_groups else []
        parts += [f"{n} {mode}-only" for n, mode in ((h.eagle_only_groups, "EAGLE"), (h.plain_only_groups, "plain")) if n]
        return f"{h} : " + ", ".join(parts)

    def layout(self, predicted: Sequence[PredictedLevel]) -> PlannedLayout:
        """The `--json` object of this layout with its predictions (no memory split without a co-located group)."""
        h = self.hardware
        assert not h.colocated_groups or None not in (h.eagle_mem_fraction, h.plain_mem_fraction), "candidates resolve their shares"
        return PlannedLayout(topology="colocated" if h.groups == 1 else "groups", groups=h.groups,
                             gpus_per_group=h.gpus_per_group, eagle_mem_fraction=h.eagle_mem_fraction,
                             plain_mem_fraction=h.plain_mem_fraction, plain_only_groups=h.plain_only_groups,
                             eagle_only_groups=h.eagle_only_groups, predicted=list(predicted))


@dataclass(frozen=True)
class ServerMemory:
    """What one kind of server of a layout gets: its share of its group's memory, its KV room and tokens."""

    server: str  # "eagle", "plain", "plain-only"
    share: float
    gb: float
    kv_gb: float
    kv_tokens: int

    def __str__(self) -> str:
        return f"{self.server} {self.share:g}: {self.gb:.1f} GB, {self.kv_gb:.1f} KV = {self.kv_tokens / 1000:.0f}k tok"


@dataclass(frozen=True)
class Worst:
    """A ratio's worst level: its value and the level's label (None: no level measured it)."""

    value: float | None
    level: str | None

    def __str__(self) -> str:
        return "-" if self.value is None else f"{self.value:.3f} at {self.level}"


@dataclass(frozen=True)
class Outcome:
    """A candidate after evaluation: refused (why), or its levels' predictions and worst ratios."""

    candidate: Candidate
    memory: tuple[ServerMemory, ...] = ()
    refused: str | None = None
    predicted: tuple[PredictedLevel, ...] = ()

    def worst(self, key: str, higher_is_better: bool) -> Worst:
        """The worst level of a ratio of `PredictedLevel` (`throughput_ratio`, `tpot_ratio`, `e2e_p99_ratio`)."""
        measured = [(v, p.level) for p in self.predicted if (v := getattr(p, key)) is not None]
        if not measured:
            return Worst(None, None)
        value, level = (min if higher_is_better else max)(measured, key=lambda vl: vl[0])
        return Worst(value, level)

    def rank_key(self) -> tuple[float, float, float]:
        """Sort key (smaller ranks first): banded worst throughput ratio, then TPOT, then E2E p99."""
        def band(w: Worst, sign: float) -> float:
            return math.inf if w.value is None else sign * math.floor(w.value / BAND + 1e-9)
        return (band(self.worst("throughput_ratio", True), -1.0), band(self.worst("tpot_ratio", False), 1.0),
                band(self.worst("e2e_p99_ratio", False), 1.0))


@dataclass(frozen=True)
class PlanResult:
    """Every candidate (feasible ones ranked best first, then the refused), the sweeps run and the seconds taken."""

    ranked: tuple[Outcome, ...]
    refused: tuple[Outcome, ...]
    sweeps: int
    seconds: float

    @property
    def best(self) -> Outcome:
        """The first-ranked layout."""
        return self.ranked[0]


class Unplannable(ValueError):
    """The traffic or the node cannot be planned (the message says why, and what would do)."""


def candidates(
    profile: Profile, gpus: int, kv_shares: Sequence[float], longest_request_tokens: int | None = None
) -> list[tuple[Candidate, str | None]]:
    """Every candidate layout of `gpus` GPUs and why it is refused before any sweep (None: not refused).

    Groupings are G GPUs per group for each G dividing `gpus`; for each, every KV split, and with two
    or more groups: half of them plain-only at the default split (the first of `kv_shares`), and no
    co-located group at all, half the groups or three quarters (at least one plain) EAGLE-only and
    the rest plain-only (each server on whole GPUs, so no second copy of the weights to hold). Every split
    keeps a plain server's KV room for one request of `longest_request_tokens` (default: the profile's
    context length; `memory_split`'s floor), as the launcher's default split does.
    """
    out: list[tuple[Candidate, str | None]] = []
    floor = request_kv_gb(profile, longest_request_tokens)
    for size in (g for g in range(1, gpus + 1) if gpus % g == 0):
        groups = gpus // size
        for share, plain_only in [(share, 0) for share in kv_shares] + ([(kv_shares[0], groups // 2)] if groups > 1 else []):
            split = memory_split(profile.memory, size, eagle_kv_share=share, plain_kv_floor_gb=floor)
            if split is None:
                hardware = Hardware(groups, size, plain_only_groups=plain_only)
                out.append((Candidate(hardware, share), _no_room(profile, size)))
                continue
            hardware = Hardware(groups, size, split["eagle"], split["plain"], plain_only)
            if any(c.hardware == hardware for c, _ in out):
                continue  # the plain server's floor made this share's split another's
            out.append((Candidate(hardware, share), None))
        if groups > 1:
            for eagle_only in sorted({groups // 2, groups - max(1, groups // 4)}):
                hardware = Hardware(groups, size, plain_only_groups=groups - eagle_only, eagle_only_groups=eagle_only)
                out.append((Candidate(hardware, kv_shares[0]), None))
    return out


def _no_room(profile: Profile, size: int) -> str:
    memory = profile.memory
    return (f"two copies of the weights ({memory.weights_gb(True):g} + {memory.weights_gb(False):g} GB) do not fit in "
            f"0.8 of {size} x {memory.gpu_memory_gb:g} GB")


def _targets(spec: PlanSpec, hardware: Hardware) -> list[TargetSpec]:
    return same_hardware_targets(spec.profile, spec.profile_file, hardware, spec.settings, QuietProgress(), spec.policy,
                                 dict(spec.policy_params))[1]


def check(spec: PlanSpec, profile: Profile, candidate: Candidate) -> tuple[tuple[ServerMemory, ...], str | None]:
    """The memory each server of `candidate` gets, and why the launch plan or the simulator refuses it (None: fits)."""
    try:
        targets = _targets(spec, candidate.hardware)
        slots = [plan_layout(t.sim, profile) for t in targets]
    except (RuntimeError, ValueError) as exc:  # the launch plan's PlanError, the simulator's LayoutError
        return (), str(exc)
    return _memory(slots[-1]), None  # specgate's servers come last


def _memory(slots: Sequence[ServerSlot]) -> tuple[ServerMemory, ...]:
    seen: dict[str, ServerMemory] = {}
    groups: dict[int, list[ServerSlot]] = {}
    for slot in slots:
        groups.setdefault(slot.group, []).append(slot)
    for members in groups.values():
        for slot in members:
            kind = slot.role if len(members) > 1 else f"{slot.role}-only"
            seen.setdefault(kind, ServerMemory(kind, slot.mem_share, slot.weights_gb + slot.kv_budget_gb,
                                               slot.kv_budget_gb, slot.max_total_tokens))
    return tuple(seen.values())


def capacity(profile: Profile, servers: int, settings: SweepSettings) -> float:
    """Requests/s at most `servers` servers of the profile's faster-saturating role carry on the workload's mean lengths."""
    out, prompt = _mean(settings.lengths, settings.output_len), _mean(settings.lengths, settings.input_len) + CHAT_TEMPLATE_TOKENS
    best = max(profile.closed_loop_throughput(role, profile.role(role).max_running_requests, round(out), round(prompt))
               for role in ("plain", "eagle"))
    return servers * best / out


def _mean(lengths: LengthDist, length: int) -> float:
    if lengths.kind == "uniform":
        return (max(1, int(length * lengths.range_ratio)) + length) / 2
    return float(length)  # fixed, and lognormal (whose mean is L by construction)


def check_rates(spec: PlanSpec, profile: Profile, feasible: Sequence[Candidate]) -> None:
    """Unplannable when an open-loop rate is beyond what any feasible layout carries, naming the nearest that is."""
    servers = max(c.hardware.groups for c in feasible)
    most = capacity(profile, servers, spec.settings)
    for level in spec.settings.levels:
        rate = level.request_rate
        if rate is not None and math.isfinite(rate) and rate > most:
            nearest = math.floor(most * 10) / 10
            raise Unplannable(
                f"--request-rate {rate:g} is beyond any layout's capacity: {spec.gpus} GPUs carry at most about "
                f"{most:.2f} requests/s of these lengths ({servers} servers saturated); the nearest feasible rate is "
                f"{nearest:g}"
            )


@dataclass(frozen=True)
class _Job:
    """One sweep: a target of a hardware's same-hardware envelope."""

    spec: PlanSpec
    hardware: Hardware
    target: str


def _sweep(job: _Job) -> list[LevelStats]:
    target = next(t for t in _targets(job.spec, job.hardware) if t.name == job.target)
    levels = sweep_target(target, job.spec.settings, level_plans(job.spec.settings), QuietProgress(), job.spec.draws)
    return [lv.targets[job.target].stats for lv in levels]


def plan(spec: PlanSpec, jobs: int = 1, on_sweep: Callable[[int, int], None] | None = None) -> PlanResult:
    """Evaluate every candidate; Unplannable when none holds the model or a rate is beyond every layout.

    `jobs`: processes running the sweeps (1: this one); `on_sweep(done, total)` after each sweep.
    """
    began = time.perf_counter()
    profile = profile_for(spec.profile, spec.profile_file)
    checked: list[Outcome] = []
    for candidate, why in candidates(profile, spec.gpus, spec.kv_shares, spec.longest_request_tokens):
        memory, refused = ((), why) if why is not None else check(spec, profile, candidate)
        checked.append(Outcome(candidate, memory, refused))
    feasible = [o.candidate for o in checked if o.refused is None]
    if not feasible:
        reasons = "; ".join(sorted({f"{o.candidate.hardware}: {o.refused}" for o in checked}))
        raise Unplannable(f"no layout of {spec.gpus} GPUs holds the model: {reasons}")
    check_rates(spec, profile, feasible)
    # The baselines of each grouping, swept beside one of its feasible layouts (the harness plans specgate's too).
    groupings = {(c.hardware.groups, c.hardware.gpus_per_group): c.hardware for c in reversed(feasible)}
    work = [_Job(spec, groupings[key], name) for key in sorted(groupings, reverse=True) for name in BASELINES]
    work += [_Job(spec, c.hardware, SUBJECT) for c in feasible]
    results = _run(work, jobs, on_sweep)
    baselines = {f"{job.target} {job.hardware.groups}x{job.hardware.gpus_per_group}": stats
                 for job, stats in zip(work, results, strict=True) if job.target != SUBJECT}
    subject = {job.hardware: stats for job, stats in zip(work, results, strict=True) if job.target == SUBJECT}
    outcomes = [o if o.refused is not None else _judged(o, spec.settings, subject[o.candidate.hardware], baselines)
                for o in checked]
    ranked = sorted((o for o in outcomes if o.refused is None), key=Outcome.rank_key)
    if not ranked:
        raise Unplannable("every layout failed requests of this workload: " +
                        "; ".join(f"{o.candidate.name}: {o.refused}" for o in outcomes))
    return PlanResult(tuple(ranked), tuple(o for o in outcomes if o.refused is not None), len(work),
                      time.perf_counter() - began)


def _run(work: Sequence[_Job], jobs: int, on_sweep: Callable[[int, int], None] | None) -> list[list[LevelStats]]:
    results: list[list[LevelStats] | None] = [None] * len(work)
    report = on_sweep or (lambda done, total: None)
    if jobs <= 1:
        for index, job in enumerate(work):
            results[index] = _sweep(job)
            report(index + 1, len(work))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_sweep, job): index for index, job in enumerate(work)}
            for done, future in enumerate(as_completed(futures), start=1):
                results[futures[future]] = future.result()
                report(done, len(work))
    return [r for r in results if r is not None]


def _judged(outcome: Outcome, settings: SweepSettings, mine: Sequence[LevelStats],
            baselines: dict[str, list[LevelStats]]) -> Outcome:
    """The outcome with each level's prediction and ratios against the best baseline of every grouping."""
    failed = sum(st.failed for st in mine)
    if failed:
        errors = sorted({e for st in mine for e in st.errors})
        return replace(outcome, refused=f"{failed} request(s) of this workload failed on it ({', '.join(errors)})")
    comparison_names = tuple(baselines)
    predicted = []
    for index, (level, stats) in enumerate(zip(settings.levels, mine, strict=True)):
        targets = {SUBJECT: TargetResult(stats, _NO_MONITOR)}
        targets |= {name: TargetResult(levels[index], _NO_MONITOR) for name, levels in baselines.items()}
        result = LevelResult(level.concurrency, level.request_rate, stats.completed + stats.failed, targets,
                             trace_time_scale=level.trace_time_scale, rate_step=level.rate_step)
        ratios = level_ratios(result, Comparison(SUBJECT, comparison_names, CARRYING_WITHIN, "same-hardware"))
        best = max(comparison_names, key=lambda n: targets[n].stats.output_tok_s)
        predicted.append(PredictedLevel(
            level=result.label, concurrency=level.concurrency, request_rate=level.request_rate,
            output_tok_s=stats.output_tok_s, ttft_p50_ms=stats.ttft.p50, ttft_p99_ms=stats.ttft.p99,
            tpot_p50_ms=stats.tpot.p50, tpot_p99_ms=stats.tpot.p99, e2e_p50_ms=stats.e2e.p50, e2e_p99_ms=stats.e2e.p99,
            throughput_ratio=ratios["throughput_ratio"], tpot_ratio=ratios["tpot_ratio"],
            e2e_p99_ratio=ratios["e2e_p99_ratio"], best_baseline=best,
        ))
    return replace(outcome, predicted=tuple(predicted))
