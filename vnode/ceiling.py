"""What one fixed mode per level reaches on specgate's own layout: the ceiling its routing is judged under.

specgate runs K co-located EAGLE + plain groups; the family's bounds compare it with the best of K
whole-GPU servers of one mode. Where no assignment of modes to its groups meets a level's bounds, no
routing policy that keeps each group in one mode for the level meets them either, and a miss there
is the layout's or the bounds', not the policy's. This module runs specgate's servers (the same
launch plan, memory split and EAGLE cap) behind a least-in-flight balancer pinned to a fixed set of
them, for each static assignment:

- `eagle`: every group speculates (its EAGLE servers only);
- `plain`: every group decodes plain;
- `split` (K >= 2): the first half of the groups speculate, the rest decode plain.

and judges each level of each assignment by the cell's bounds against the same baselines' runs. A cell is
statically attainable when every level is met by at least one assignment (the best one per level: an
oracle that knows each level's load in advance and switches between levels for free). A policy can
still beat the ceiling by switching within a level (a ramp, a drain), so a cell specgate meets beyond
it is counted too. Closed loops hold one load per level, so there the ceiling is close to the best any
one-mode-per-group policy can do; open-loop levels climb from the lighter level's load, so there it is
a yardstick, not a bound.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from loadtest.envelope.comparison import Bound, level_ratios
from loadtest.results import LevelResult
from loadtest.sweep import SweepSettings
from vnode.envelope import QuietProgress, level_plans, run_envelope, sweep_target
from vnode.family import Member
from vnode.family_sweep import WORKLOADS, Scale, Workload, cell_spec
from vnode.gateway_router import BackendSpec
from vnode.requests import Request
from vnode.router import LeastInFlightRouter
from vnode.targets import TargetSpec, same_hardware_targets

Assignment = Literal["eagle", "plain", "split"]
ASSIGNMENTS: tuple[Assignment, ...] = ("eagle", "plain", "split")


class PinnedRouter(LeastInFlightRouter):
    """The baselines' least-in-flight balancer over a fixed subset of a node's servers (`allowed`, by index)."""

    def __init__(self, names: Sequence[str], allowed: Sequence[int]) -> None:
        if not allowed:
            raise ValueError("a pinned router needs at least one server")
        super().__init__([names[i] for i in allowed])
        self._allowed = tuple(allowed)

    def route(self, request: Request, now: float) -> int:
        return self._allowed[super().route(request, now)]


def assignments(groups: int) -> tuple[Assignment, ...]:
    """The static assignments a node of `groups` groups has (`split` needs two groups)."""
    return ASSIGNMENTS if groups >= 2 else ("eagle", "plain")


def pinned_servers(backends: Sequence[BackendSpec], assignment: Assignment) -> list[int]:
    """The indices of the servers `assignment` sends requests to, in the gateway's order."""
    groups = sorted({b.group for b in backends})
    speculating = {"eagle": set(groups), "plain": set(), "split": set(groups[: len(groups) // 2])}[assignment]
    return [i for i, b in enumerate(backends) if b.speculative == (b.group in speculating)]


@dataclass(frozen=True)
class LevelCeiling:
    """One level: whether specgate met every bound there, and which assignments did."""

    label: str
    specgate: bool
    met_by: tuple[Assignment, ...]


@dataclass(frozen=True)
class CellCeiling:
    """One member under one workload: every level's verdicts, and whether specgate met the whole cell."""

    member: str
    workload: str
    levels: tuple[LevelCeiling, ...]

    @property
    def specgate(self) -> bool:
        """specgate met every bound at every level."""
        return all(lv.specgate for lv in self.levels)

    @property
    def attainable(self) -> bool:
        """Every level is met by some assignment (the best one per level)."""
        return all(lv.met_by for lv in self.levels)

    @property
    def one_assignment(self) -> tuple[Assignment, ...]:
        """The assignments that meet every level on their own."""
        return tuple(a for a in ASSIGNMENTS if all(a in lv.met_by for lv in self.levels))

    def to_json(self) -> dict[str, object]:
        return {"member": self.member, "workload": self.workload, "specgate": self.specgate,
                "attainable": self.attainable, "one_assignment": list(self.one_assignment),
                "levels": [{"label": lv.label, "specgate": lv.specgate, "met_by": list(lv.met_by)} for lv in self.levels]}


def _meets(level: LevelResult, bounds: Sequence[Bound]) -> bool:
    return all(b.holds(level.ratios.get(b.name)) for b in bounds)


def _static_levels(target: TargetSpec, settings: SweepSettings, assignment: Assignment) -> list[LevelResult]:
    assert target.gateway is not None, "specgate's target"
    backends = target.gateway.backends
    router = PinnedRouter([b.name for b in backends], pinned_servers(backends, assignment))
    return sweep_target(target, settings, level_plans(settings), QuietProgress(), draws="request", router=router)


def cell_ceiling(member: Member, workload: Workload, scale: Scale = Scale(), seed: int = 0) -> CellCeiling:
    """`member` under `workload`: specgate's envelope, and its layout run under each static assignment, every
    level judged by the workload's bounds against the same baseline runs (each request's own acceptance
    draws on every run, so every run decodes the same requests alike)."""
    with tempfile.TemporaryDirectory(prefix="vnode-ceiling-") as tmp:
        spec = cell_spec(member, workload, Path(tmp), scale, seed)
        doc = run_envelope(spec)
        assert doc.envelope is not None and doc.envelope.comparison is not None
        comparison = doc.envelope.comparison
        _, targets = same_hardware_targets(spec.profile, spec.profile_file, spec.hardware, spec.settings, QuietProgress())
        subject = next(t for t in targets if t.name == comparison.subject)
        runs = {a: _static_levels(subject, spec.settings, a) for a in assignments(member.groups)}
    levels = []
    for index, level in enumerate(doc.levels):
        met_by = []
        for assignment, run in runs.items():
            pinned = replace(level, targets={**level.targets, comparison.subject: run[index].targets[comparison.subject]})
            if _meets(replace(pinned, ratios=level_ratios(pinned, comparison)), workload.bounds):
                met_by.append(assignment)
        levels.append(LevelCeiling(level.label, _meets(level, workload.bounds), tuple(met_by)))
    return CellCeiling(member.name, workload.name, tuple(levels))


def _run(task: tuple[str, str, Scale, int]) -> CellCeiling:
    name, workload, scale, seed = task
    return cell_ceiling(Member.parse(name), WORKLOADS[workload], scale, seed)


def run_ceiling(members: Sequence[Member], workloads: Sequence[str], *, scale: Scale = Scale(), seed: int = 0,
                jobs: int = 1) -> list[CellCeiling]:
    """Every member under every workload, in `jobs` processes; cells in (member, workload) order."""
    tasks = [(m.name, w, scale, seed) for m in members for w in workloads]
    if jobs <= 1:
        return [_run(task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_run, tasks, chunksize=1))
