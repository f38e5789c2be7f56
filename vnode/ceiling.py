"""What one fixed mode per level reaches on specgate's own layout: the ceiling its routing is judged under.

specgate runs K co-located EAGLE + plain groups; the family's bounds compare it with the best of K
whole-GPU servers of one mode. Where no assignment of modes to its groups meets a level's bounds, no
routing policy that keeps each group in one mode for the level meets them either, and a miss there
is the layout's or the bounds', not the policy's. This module runs specgate's servers (the same
launch plan, memory split and EAGLE cap) behind one of the baselines' routers pinned to a fixed set of
them (the least-in-flight balancer; SMG's cache_aware where prefixes matter, `Static`), for each static
assignment:

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
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from backends.sim.core import EngineCore
from backends.sim.request import RequestError
from loadtest.envelope.baselines import Router as RouterKind
from loadtest.envelope.comparison import Bound, level_ratios
from loadtest.results import LevelResult, ResultsDocument
from loadtest.sweep import SweepSettings
from vnode.envelope import EnvelopeSpec, QuietProgress, level_plans, run_envelope, sweep_target
from vnode.family import Member
from vnode.family_sweep import WORKLOADS, Scale, Workload, cell_spec
from vnode.gateway_router import BackendSpec
from vnode.requests import Request
from vnode.router import EngineWatcher, LeastInFlightRouter, NeverMoves, Router
from vnode.smg_router import SmgCacheAwareRouter, SmgSettings
from vnode.targets import TargetSpec, same_hardware_targets

Assignment = Literal["eagle", "plain", "split"]
ASSIGNMENTS: tuple[Assignment, ...] = ("eagle", "plain", "split")


class PinnedRouter(NeverMoves):
    """A baseline's router (`inner`: the least-in-flight balancer, or SMG's cache_aware) over a fixed subset of a
    node's servers (`allowed`, by index): `inner` indexes the subset, and reads only its servers' engines. A
    request that no allowed server's KV cache can hold goes to the least-loaded other server that can (as the
    gateway's `adaptive_kv_fit`), and one `inner` sends to an allowed server that cannot hold it goes to the
    least-loaded allowed one that can: an assignment is judged on what it serves, not failed by one long prompt."""

    def __init__(self, inner: Router, allowed: Sequence[int]) -> None:
        if not allowed:
            raise ValueError("a pinned router needs at least one server")
        self._inner = inner
        self._allowed = tuple(allowed)
        self._cores: Sequence[EngineCore] = ()
        self._spilled: set[str] = set()

    def engines_attached(self, cores: Sequence[EngineCore]) -> None:
        self._cores = cores
        if isinstance(self._inner, EngineWatcher):
            self._inner.engines_attached([cores[i] for i in self._allowed])

    def route(self, request: Request, now: float) -> int:
        holders = [i for i, core in enumerate(self._cores) if _holds(core, request)]
        pinned = [i for i in holders if i in self._allowed]
        if holders and not pinned:
            return self._spill(request, holders)
        index = self._allowed[self._inner.route(request, now)]
        if holders and index not in holders:
            self._inner.finish(request, now, None)  # its balancer's count of it ends here: it goes elsewhere
            return self._spill(request, pinned)
        return index

    def _spill(self, request: Request, servers: Sequence[int]) -> int:
        """`request` to the least-loaded of `servers`, outside `inner`'s count."""
        self._spilled.add(request.rid)
        return min(servers, key=lambda i: (len(self._cores[i].running) + len(self._cores[i].waiting), i))

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        if request.rid not in self._spilled:
            self._inner.chunk(request, now, tokens)

    def finish(self, request: Request, now: float, output_tokens: int | None, cached_tokens: int = 0) -> None:
        if request.rid in self._spilled:
            self._spilled.discard(request.rid)
        else:
            self._inner.finish(request, now, output_tokens, cached_tokens)



def _holds(core: EngineCore, request: Request) -> bool:
    """Whether `core`'s server would take `request` (its prompt and output within its KV cache and input limit)."""
    try:
        core.check_fits(request.prompt_tokens, request.max_tokens)
    except RequestError:
        return False
    return True


def assignments(groups: int) -> tuple[Assignment, ...]:
    """The static assignments a node of `groups` groups has (`split` needs two groups)."""
    return ASSIGNMENTS if groups >= 2 else ("eagle", "plain")


def pinned_servers(backends: Sequence[BackendSpec], assignment: Assignment) -> list[int]:
    """The indices of the servers `assignment` sends requests to, in the gateway's order."""
    groups = sorted({b.group for b in backends})
    speculating = {"eagle": set(groups), "plain": set(), "split": set(groups[: len(groups) // 2])}[assignment]
    return [i for i, b in enumerate(backends) if b.speculative == (b.group in speculating)]


@dataclass(frozen=True)
class Static:
    """One fixed way of running specgate's layout: an assignment of modes behind one of the baselines' routers."""

    assignment: Assignment
    router: RouterKind = "least-inflight"

    @property
    def label(self) -> str:
        """`plain`, `split+smg`, ...: what the reports and the JSON call it."""
        return self.assignment + ("+smg" if self.router == "smg" else "")


def statics(groups: int, routers: Sequence[RouterKind] = ("least-inflight",)) -> tuple[Static, ...]:
    """Every assignment a node of `groups` groups has behind each of `routers`."""
    return tuple(Static(a, r) for r in routers for a in assignments(groups))


def static_router(backends: Sequence[BackendSpec], static: Static, smg: SmgSettings = SmgSettings(),
                  seed: int = 0) -> PinnedRouter:
    """The router that runs `static` on servers `backends` (SMG's ties drawn from `seed`)."""
    allowed = pinned_servers(backends, static.assignment)
    inner: Router = (SmgCacheAwareRouter(len(allowed), smg, seed=seed) if static.router == "smg"
                     else LeastInFlightRouter([backends[i].name for i in allowed]))
    return PinnedRouter(inner, allowed)


def static_levels(target: TargetSpec, settings: SweepSettings, static: Static,
                  smg: SmgSettings = SmgSettings()) -> list[LevelResult]:
    """specgate's target (its servers, not its policy) through every level under `static`, each request's own
    acceptance draws (as the envelopes it is judged against run)."""
    assert target.gateway is not None, "specgate's target"
    router = static_router(target.gateway.backends, static, smg, target.sim.seed)
    return sweep_target(target, settings, level_plans(settings), QuietProgress(), draws="request", router=router)


@dataclass(frozen=True)
class LevelCeiling:
    """One level: whether specgate met every bound there, and which assignments did."""

    label: str
    specgate: bool
    met_by: tuple[str, ...]  # the labels of the static runs (`Static.label`) that met it


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
    def one_assignment(self) -> tuple[str, ...]:
        """The static runs that meet every level on their own."""
        return tuple(a for a in self.levels[0].met_by if all(a in lv.met_by for lv in self.levels)) if self.levels else ()

    def to_json(self) -> dict[str, object]:
        return {"member": self.member, "workload": self.workload, "specgate": self.specgate,
                "attainable": self.attainable, "one_assignment": list(self.one_assignment),
                "levels": [{"label": lv.label, "specgate": lv.specgate, "met_by": list(lv.met_by)} for lv in self.levels]}


def _meets(level: LevelResult, bounds: Sequence[Bound]) -> bool:
    return all(b.holds(level.ratios.get(b.name)) for b in bounds)


def judge(doc: ResultsDocument, runs: Mapping[str, Sequence[LevelResult]],
          bounds: Sequence[Bound]) -> tuple[LevelCeiling, ...]:
    """Each level of the envelope `doc`: whether its subject met `bounds`, and which of `runs` (a static run of
    the subject's layout by its label, level for level) would have, put in the subject's place."""
    assert doc.envelope is not None and doc.envelope.comparison is not None
    comparison = doc.envelope.comparison
    levels = []
    for index, level in enumerate(doc.levels):
        met_by = []
        for label, run in runs.items():
            pinned = replace(level, targets={**level.targets, comparison.subject: run[index].targets[comparison.subject]})
            if _meets(replace(pinned, ratios=level_ratios(pinned, comparison)), bounds):
                met_by.append(label)
        levels.append(LevelCeiling(level.label, _meets(level, bounds), tuple(met_by)))
    return tuple(levels)


def subject_target(spec: EnvelopeSpec, doc: ResultsDocument) -> TargetSpec:
    """The target `doc`'s comparison judges (specgate), as `spec` builds it."""
    assert doc.envelope is not None and doc.envelope.comparison is not None
    _, targets = same_hardware_targets(spec.profile, spec.profile_file, spec.hardware, spec.settings, QuietProgress(),
                                       spec.policy, dict(spec.policy_params), spec.routers, spec.smg)
    return next(t for t in targets if t.name == doc.envelope.comparison.subject)


def cell_ceiling(member: Member, workload: Workload, scale: Scale = Scale(), seed: int = 0) -> CellCeiling:
    """`member` under `workload`: specgate's envelope, and its layout run under each static assignment behind the
    least-in-flight balancer, every level judged by the workload's bounds against the same baseline runs (each
    request's own acceptance draws on every run, so every run decodes the same requests alike)."""
    with tempfile.TemporaryDirectory(prefix="vnode-ceiling-") as tmp:
        spec = cell_spec(member, workload, Path(tmp), scale, seed)
        doc = run_envelope(spec)
        subject = subject_target(spec, doc)
        runs = {s.label: static_levels(subject, spec.settings, s) for s in statics(member.groups)}
    return CellCeiling(member.name, workload.name, judge(doc, runs, workload.bounds))


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
