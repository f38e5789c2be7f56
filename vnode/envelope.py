"""The same-hardware envelope in virtual time: every target on the same levels' plans, judged as the real envelope judges.

Each target gets a fresh node (idle servers, empty prefix caches, a policy that knows nothing), the
load tool's warm-up requests, then every level in order on one clock, as the real-time envelope
sweeps one target after another. A level's records become `loadtest.stats.LevelStats` (throughput,
TTFT/TPOT/ITL/E2E percentiles, cache hit rate, goodput under the SLOs), the levels a results
document in the load tool's format, and `loadtest.envelope.comparison.add_ratios` adds the ratios
against the best baseline per level and the bounds' verdict. Deterministic: nothing reads a clock.
Cache hits are the engines' own counts, the ones the real-time envelope's simulators report in usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from loadtest.envelope.baselines import Router as RouterKind
from loadtest.envelope.comparison import Bound, add_ratios
from loadtest.envelope.fair import Hardware, merge_levels
from loadtest.prompts import PromptFactory
from loadtest.records import RequestRecord
from loadtest.report import build_document
from loadtest.results import LevelResult, Monitor, ResultsDocument, TargetResult
from loadtest.stats import LevelStats, level_stats
from loadtest.sweep import Level, Progress, SweepSettings, Target
from loadtest.workloads.plan import Plan, Session, Turn
from vnode.clients import run_plan
from vnode.events import EventQueue
from vnode.router import Router
from vnode.smg_router import SmgSettings
from vnode.targets import Draws, TargetSpec, same_hardware_targets

_NO_MONITOR = Monitor({}, {})  # nothing shares a machine with the model: no self-checks to record


class QuietProgress:
    """A `Progress` that shows nothing."""

    def level_started(self, target: str, level: Level, total: int) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        pass

    def level_finished(self, target: str, level: Level, stats: LevelStats) -> None:
        pass


@dataclass(frozen=True)
class EnvelopeSpec:
    """An envelope: the profile (a built-in name and/or a file laid over it), K x G GPUs, specgate's policy,
    the sweep's levels and workload, the bounds to check, whose acceptance draws and what hop between clients
    and servers each target has (see `TargetSpec.node`), and the routers in front of the baselines."""

    hardware: Hardware
    settings: SweepSettings
    profile: str | None = None
    profile_file: Path | None = None
    policy: str = "adaptive"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    bounds: tuple[Bound, ...] = ()
    draws: Draws = "server"
    hops: Mapping[str, float] = field(default_factory=dict)  # seconds each way per target name (absent: 0)
    routers: tuple[RouterKind, ...] = ("least-inflight",)  # the baselines' routers, as `--baseline-router` picks
    smg: SmgSettings = SmgSettings()  # the `+smg` targets' emulated SMG
    taught: bool = False  # a what-if: specgate's policy starts knowing its servers' curves (`GatewayRouter.teach`)


CHAT_TEMPLATE_TOKENS = 7  # the simulator's chat template around a prompt of the workload's length


def output_tokens(text: str) -> int:
    """Tokens of a chunk of the simulator's output: one-token words, each after a space (tokencount's count, faster)."""
    return text.count(" ")


def warm_up_plan(settings: SweepSettings) -> Plan | None:
    """The load tool's warm-up before the first level: `warmup` short requests at once (None: none)."""
    if settings.warmup < 1:
        return None
    specs = PromptFactory(settings.input_len, min(settings.output_len, 16), seed=settings.seed - 1).take(settings.warmup)
    return Plan(tuple(Session((Turn((s.prompt,), s.output_len),)) for s in specs), concurrency=settings.warmup)


def sweep_target(
    target: TargetSpec,
    settings: SweepSettings,
    plans: Sequence[Plan],
    progress: Progress,
    draws: Draws = "server",
    hop: float = 0.0,
    taught: bool = False,
    router: Router | None = None,
) -> list[LevelResult]:
    """One target through the warm-up and every level, on a fresh node (`taught`: see `EnvelopeSpec`; the chat
    template's 7 tokens added to the prompt; `router`: one in place of the target's own, see `TargetSpec.node`)."""
    events = EventQueue()
    node = target.node(events, router=router, draws=draws, hop=hop,
                       taught=(settings.input_len + CHAT_TEMPLATE_TOKENS, settings.output_len) if taught else None)
    warm = warm_up_plan(settings)
    if warm is not None:
        run_plan(node, warm)
    results = []
    for level, plan in zip(settings.levels, plans, strict=True):
        progress.level_started(target.name, level, plan.requests)
        run = run_plan(node, plan)
        for record in run.records:
            progress.request_done(record)
        stats = level_stats(run, output_tokens, slo=settings.slo)
        progress.level_finished(target.name, level, stats)
        results.append(LevelResult(
            level.concurrency, level.request_rate, plan.requests, {target.name: TargetResult(stats, _NO_MONITOR)},
            offered_request_s=plan.offered_request_s, trace_time_scale=level.trace_time_scale, rate_step=level.rate_step,
        ))
    return results


@lru_cache(maxsize=32)  # the family and the planner run one workload's plans many times: make them once per process
def level_plans(settings: SweepSettings) -> list[Plan]:
    """The plans of every level of `settings`, made once per process."""
    return settings.plans()


def run_envelope(spec: EnvelopeSpec, progress: Progress | None = None, command: str = "") -> ResultsDocument:
    """Every target of `spec` on every level; the results document with its ratios and bound checks."""
    progress = progress or QuietProgress()
    settings = spec.settings
    fair, targets = same_hardware_targets(spec.profile, spec.profile_file, spec.hardware, settings, progress,
                                          spec.policy, dict(spec.policy_params), spec.routers, spec.smg)
    plans = level_plans(settings)
    results = merge_levels([
        sweep_target(target, settings, plans, progress, spec.draws, spec.hops.get(target.name, 0.0), spec.taught)
        for target in targets
    ])
    profile = spec.profile or str(spec.profile_file)
    params = ", ".join(f"{k}={v}" for k, v in spec.policy_params.items())
    doc = build_document(
        "envelope", results, [Target(t.name, f"vnode:{t.name}") for t in targets], settings, command,
        title=f"vnode envelope: {profile}, {fair.layout()}, policy {spec.policy}" + (f" ({params})" if params else ""),
        stack={
            "model": "vnode (virtual time)",
            "profile": spec.profile,
            "profile_file": str(spec.profile_file) if spec.profile_file else None,
            "groups": spec.hardware.groups,
            "gpus_per_group": spec.hardware.gpus_per_group,
            "eagle_mem_fraction": spec.hardware.eagle_mem_fraction,
            "plain_mem_fraction": spec.hardware.plain_mem_fraction,
            "plain_only_groups": spec.hardware.plain_only_groups,
            "eagle_only_groups": spec.hardware.eagle_only_groups,
            "eagle_dp_max_running_requests": fair.eagle_cap,
            "policy": spec.policy,
            "policy_params": dict(spec.policy_params),
            "compare": fair.comparison().kind,
            "draws": spec.draws,
            "baseline_routers": list(spec.routers),
            **({"smg": {"emulated": True, "version": fair.smg.version, "policy_settings": fair.smg_policy}}
               if fair.smg is not None else {}),
            "hop_seconds": dict(spec.hops),
            "taught": spec.taught,
            "config": fair.config,
        },
        preamble=[fair.describe(), "Modelled in virtual time (vnode): the simulator's engine cores on a discrete-event "
                  "clock, no HTTP, no time scale; latencies and throughput are the model's own. Acceptance draws: "
                  + ("each request's own, the same on every target." if spec.draws == "request" else "each server's own, "
                     "as the simulator draws them.")
                  + (" Taught: specgate's policy started knowing its servers' curves (a what-if)." if spec.taught else "")],
    )
    return add_ratios(doc, fair.comparison(), spec.bounds)
