"""The family's sweep: every member under every workload, judged against the best data-parallel baseline.

Workloads (all chat, prompts of `input_len`, answers of `output_len` tokens; the same plans for
every target, seeded):
- `closed`, `closed-uniform`, `closed-lognormal`: closed loop at C = 1, 2, 4, ..., 256, lengths fixed,
  uniform over [0.1 L, L], or lognormal (median half the mean). Bounds: throughput >= 0.97x and
  TPOT p50 <= 1.03x the best of plain-dp, eagle-dp and adaptive-dp (the envelope's same-hardware
  rule: TPOT against the baselines that carry the load).
- `poisson`, `gamma`: open loop at 10, 25, 50, 75, 90 and 95% of plain-dp's capacity, Poisson or
  gamma arrivals of burstiness 0.5. Bounds: E2E p50 <= 1.05x and p99 <= 1.10x the lowest carrying
  baseline's at every rate.
- `step`: one open-loop level stepping from 25% of that capacity to 90% and back (the rate-step
  arrivals of `loadtest.workloads`), the open-loop bounds.
Every workload also requires that no request of any target failed. Capacity is the model's: K plain
servers saturated (their running cap in flight) on the workload's mean lengths, in requests/s.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from backends.sim.profiles import Profile
from loadtest.envelope.comparison import FAILED, Bound
from loadtest.envelope.fair import Hardware
from loadtest.results import ResultsDocument
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings
from loadtest.verdicts import BoundCheck
from loadtest.workloads.lengths import LengthDist
from loadtest.workloads.level import RateStep
from vnode.envelope import CHAT_TEMPLATE_TOKENS, EnvelopeSpec, run_envelope
from vnode.family import BASE_PROFILE, Member

CLOSED_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOADS = (0.10, 0.25, 0.50, 0.75, 0.90, 0.95)
STEP_LOADS = (0.25, 0.90)
GAMMA_BURSTINESS = 0.5
WARMUP = 2  # the envelope command's default warm-up before the first level
CLOSED_BOUNDS = (Bound("throughput_ratio", ">=", 0.97), Bound("tpot_ratio", "<=", 1.03), Bound(FAILED, "<=", 0.0))
OPEN_BOUNDS = (Bound("e2e_p50_ratio", "<=", 1.05), Bound("e2e_p99_ratio", "<=", 1.10), Bound(FAILED, "<=", 0.0))


@dataclass(frozen=True)
class Scale:
    """How much each workload sends: lengths, requests per closed-loop slot (at least `closed_min` a level),
    requests per open-loop rate, and the rate step's requests."""

    input_len: int = 128
    output_len: int = 64
    closed_per_slot: int = 4
    closed_min: int = 16
    open_requests: int = 200
    step_requests: int = 400

    def times(self, factor: int) -> Scale:
        """`factor` times the requests, lengths unchanged (steadier statistics, `factor` times the run time)."""
        return replace(self, closed_per_slot=self.closed_per_slot * factor, closed_min=self.closed_min * factor,
                       open_requests=self.open_requests * factor, step_requests=self.step_requests * factor)


@dataclass(frozen=True)
class Workload:
    """A named workload: its sweep settings for a member's profile, and its bounds."""

    name: str
    settings: Callable[[Profile, int, Scale, int], SweepSettings]  # (profile, groups, scale, seed)
    bounds: tuple[Bound, ...]


def plain_capacity(profile: Profile, groups: int, lengths: LengthDist, scale: Scale) -> float:
    """Requests/s of K plain servers, each running its cap of requests of the workload's mean lengths."""
    out, prompt = _mean(lengths, scale.output_len), _mean(lengths, scale.input_len) + CHAT_TEMPLATE_TOKENS
    cap = profile.plain.max_running_requests
    return groups * profile.closed_loop_throughput("plain", cap, round(out), round(prompt)) / out


def _mean(lengths: LengthDist, length: int) -> float:
    if lengths.kind == "uniform":
        low = max(1, int(length * lengths.range_ratio))
        return (low + length) / 2
    return float(length)  # fixed, and lognormal (whose mean is L by construction)


def _closed(lengths: LengthDist) -> Callable[[Profile, int, Scale, int], SweepSettings]:
    def settings(profile: Profile, groups: int, scale: Scale, seed: int) -> SweepSettings:
        levels = tuple(Level(concurrency=c) for c in CLOSED_LEVELS)
        return SweepSettings(levels=levels, requests_per_level=RequestsPerLevel(scale.closed_per_slot, True, scale.closed_min),
                             input_len=scale.input_len, output_len=scale.output_len, lengths=lengths,
                             range_ratio=lengths.range_ratio, seed=seed, warmup=WARMUP)
    return settings


def _open(burstiness: float) -> Callable[[Profile, int, Scale, int], SweepSettings]:
    def settings(profile: Profile, groups: int, scale: Scale, seed: int) -> SweepSettings:
        capacity = plain_capacity(profile, groups, LengthDist(), scale)
        levels = tuple(Level(request_rate=_rate(load * capacity)) for load in LOADS)
        return SweepSettings(levels=levels, requests_per_level=RequestsPerLevel(scale.open_requests),
                             input_len=scale.input_len, output_len=scale.output_len, burstiness=burstiness, seed=seed,
                             warmup=WARMUP)
    return settings


def _step(profile: Profile, groups: int, scale: Scale, seed: int) -> SweepSettings:
    capacity = plain_capacity(profile, groups, LengthDist(), scale)
    low, high = (_rate(load * capacity) for load in STEP_LOADS)
    step = RateStep(low, high, _rate(scale.step_requests / (2 * low + high)))
    return SweepSettings(levels=(Level(rate_step=step),), requests_per_level=RequestsPerLevel(step.requests),
                         input_len=scale.input_len, output_len=scale.output_len, seed=seed, warmup=WARMUP)


def _rate(value: float) -> float:
    """A rate (or a duration) to 3 significant figures, so a level's label reads well."""
    return float(f"{value:.3g}")


WORKLOADS = {
    w.name: w
    for w in (
        Workload("closed", _closed(LengthDist()), CLOSED_BOUNDS),
        Workload("closed-uniform", _closed(LengthDist("uniform", 0.1)), CLOSED_BOUNDS),
        Workload("closed-lognormal", _closed(LengthDist("lognormal")), CLOSED_BOUNDS),
        Workload("poisson", _open(1.0), OPEN_BOUNDS),
        Workload("gamma", _open(GAMMA_BURSTINESS), OPEN_BOUNDS),
        Workload("step", _step, OPEN_BOUNDS),
    )
}


@dataclass(frozen=True)
class Cell:
    """One member under one workload: each bound's check over its levels, and the seconds it took."""

    member: str
    workload: str
    checks: tuple[BoundCheck, ...]
    seconds: float

    @property
    def failed(self) -> tuple[BoundCheck, ...]:
        """The bounds not met."""
        return tuple(c for c in self.checks if not c.met)


def cell_document(
    member: Member, workload: Workload, scale: Scale = Scale(), seed: int = 0, policy_params: dict[str, object] | None = None,
    taught: bool = False,
) -> ResultsDocument:
    """`member` under `workload`: its envelope in virtual time (each request's own acceptance draws on every
    target), with the workload's bounds checked; `taught`: specgate's policy starts knowing its servers' curves."""
    with tempfile.TemporaryDirectory(prefix="vnode-family-") as tmp:
        return run_envelope(cell_spec(member, workload, Path(tmp), scale, seed, policy_params, taught))


def cell_spec(
    member: Member, workload: Workload, directory: Path, scale: Scale = Scale(), seed: int = 0,
    policy_params: dict[str, object] | None = None, taught: bool = False,
) -> EnvelopeSpec:
    """The envelope `cell_document` runs, the member's profile file written to `directory` (which must outlast it)."""
    profile = member.profile()
    settings = workload.settings(profile, member.groups, scale, seed)
    return EnvelopeSpec(Hardware(member.groups, profile.num_gpus), settings, BASE_PROFILE, member.write(directory),
                        policy_params=policy_params or {}, bounds=workload.bounds, draws="request", taught=taught)


def run_cell(
    member: Member, workload: Workload, scale: Scale = Scale(), seed: int = 0, policy_params: dict[str, object] | None = None,
    taught: bool = False,
) -> Cell:
    """`cell_document`'s verdict, and how long it took."""
    began = time.perf_counter()  # the run's cost, reported; nothing in the model reads it
    doc = cell_document(member, workload, scale, seed, policy_params, taught)
    assert doc.envelope is not None
    return Cell(member.name, workload.name, doc.envelope.checks, time.perf_counter() - began)


def _run(task: tuple[str, str, Scale, int, dict[str, object], bool]) -> Cell:
    name, workload, scale, seed, params, taught = task
    return run_cell(Member.parse(name), WORKLOADS[workload], scale, seed, params, taught)


def run_family(
    members: Sequence[Member],
    workloads: Sequence[str],
    *,
    scale: Scale = Scale(),
    seed: int = 0,
    jobs: int = 1,
    policy_params: dict[str, object] | None = None,
    taught: bool = False,
) -> list[Cell]:
    """Every member under every workload, in `jobs` processes; cells in (member, workload) order."""
    tasks = [(m.name, w, scale, seed, dict(policy_params or {}), taught) for m in members for w in workloads]
    if jobs <= 1:
        return [_run(task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_run, tasks, chunksize=1))
