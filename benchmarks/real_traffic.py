"""specgate against every data-parallel baseline, behind the least-in-flight balancer and behind SMG's cache_aware
policy, on real-traffic workloads in virtual time (issue 28 part 4): docs/benchmarks/real-traffic.md and .json.

    python benchmarks/real_traffic.py [--out docs/benchmarks/real-traffic] [--jobs 2] [--seed 0] [--trace-requests 128]
                                      [--eagle-kv-share S]

Cells: profile (field-8gpu K=1, llama8b-h100 K=8, the calibrated h200-llama8b K=8) x workload (shared-prefix,
multi-turn, a window of the Mooncake conversation trace, random), each open loop at 10, 30, 50, 70 and 90% of
plain-dp's capacity on that workload (measured first: plain-dp alone, every request sent at once). Each cell is
one `vnode.envelope.run_envelope` with both routers (K > 1; K=1 has one server per baseline) and each request's
own acceptance draws (`--draws request`), so targets that route alike produce the same numbers.

Goodput counts requests within a TTFT and a TPOT SLO set per cell from a light run (the 10% level alone, 64
requests): 2x the lowest TTFT p50 and 1.5x the lowest TPOT p50 of any target there. Bounds: prefix workloads
output tok/s >= 0.97x, TTFT p50 <= 1.10x and E2E p50 <= 1.05x the best baseline (SMG's included) at every rate;
`random` the routing issue's open-loop bounds (tok/s >= 0.97x, E2E p50 <= 1.05x, E2E p99 <= 1.10x); no failed
request anywhere.

specgate's co-located groups split their memory as the launcher does by default unless `--eagle-kv-share` gives
EAGLE's share of the KV room the two copies leave (`backends.resolve.memory_split`, as `specgate plan
--eagle-kv-shares` tries); the baselines' servers each have their GPUs alone either way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.resolve import memory_split, request_kv_gb  # noqa: E402
from loadtest.envelope.baselines import Router  # noqa: E402
from loadtest.envelope.comparison import FAILED, Bound  # noqa: E402
from loadtest.envelope.fair import Hardware  # noqa: E402
from loadtest.envelope.timescale import profile_for  # noqa: E402
from loadtest.results import ResultsDocument  # noqa: E402
from loadtest.stats import Slo  # noqa: E402
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings  # noqa: E402
from loadtest.workloads.multi_turn import MultiTurn  # noqa: E402
from loadtest.workloads.random_prompts import RandomPrompts  # noqa: E402
from loadtest.workloads.shared_prefix import SharedPrefix  # noqa: E402
from loadtest.workloads.trace import TraceReplay  # noqa: E402
from loadtest.workloads.workload import Dataset  # noqa: E402
from benchmarks.real_traffic_doc import markdown  # noqa: E402
from vnode.envelope import EnvelopeSpec, QuietProgress, run_envelope, sweep_target  # noqa: E402
from vnode.targets import same_hardware_targets  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACE = Path("/work/shared/traces/mooncake-conversation.jsonl")
LOADS = (0.1, 0.3, 0.5, 0.7, 0.9)
REQUESTS = 256  # per level (shared-prefix: 16 groups x 16; multi-turn: 64 conversations x 4 turns)
TRACE_REQUESTS = 128  # the trace window: its first requests (long prompts: about 12k tokens on average)
PREFIX_BOUNDS = (Bound("throughput_ratio", ">=", 0.97), Bound("ttft_p50_ratio", "<=", 1.10),
                 Bound("e2e_p50_ratio", "<=", 1.05), Bound(FAILED, "<=", 0.0))
RANDOM_BOUNDS = (Bound("throughput_ratio", ">=", 0.97), Bound("e2e_p50_ratio", "<=", 1.05),
                 Bound("e2e_p99_ratio", "<=", 1.10), Bound(FAILED, "<=", 0.0))
WORKLOADS = ("shared-prefix", "multi-turn", "trace", "random")


@dataclass(frozen=True)
class Machine:
    """A profile and the hardware every target runs on."""

    label: str
    profile: str | None
    profile_file: str | None
    groups: int
    gpus_per_group: int
    eagle_kv_share: float | None = None  # EAGLE's share of a co-located group's KV room; None: the launcher's split


MACHINES = (
    Machine("field-8gpu K=1", "field-8gpu", None, 1, 8),
    Machine("llama8b-h100 K=8", "llama8b-h100", None, 8, 1),
    Machine("h200-llama8b K=8", None, "backends/sim/measured/h200-llama8b.toml", 8, 1),
)


def dataset(workload: str, trace_requests: int = TRACE_REQUESTS) -> Dataset:
    """The workload's dataset at this benchmark's size (the trace: its first `trace_requests`)."""
    if workload == "shared-prefix":
        return SharedPrefix(num_groups=16, prompts_per_group=16)
    if workload == "multi-turn":
        return MultiTurn()
    if workload == "trace":
        return TraceReplay.load(TRACE, num_requests=trace_requests)
    return RandomPrompts()


def routers(machine: Machine) -> tuple[Router, ...]:
    """Both routers where there is a choice (K > 1)."""
    return ("least-inflight", "smg") if machine.groups > 1 else ("least-inflight",)


def trace_rate(replay: TraceReplay) -> float:
    """The trace window's own request rate (requests/s on its clock)."""
    window = replay.window()
    span = (window[-1].timestamp_ms - window[0].timestamp_ms) / 1000.0
    return len(window) / span


def level_at(workload: str, rate: float, trace_requests: int = TRACE_REQUESTS) -> Level:
    """An open-loop level offering `rate` requests/s (the trace: its clock scaled to that rate)."""
    if workload == "trace":
        return Level(trace_time_scale=trace_rate(dataset("trace", trace_requests)) / rate)  # type: ignore[arg-type]
    return Level(request_rate=rate)


def settings_for(workload: str, levels: tuple[Level, ...], requests: int, slo: Slo = Slo(), seed: int = 0,
                 trace_requests: int = TRACE_REQUESTS) -> SweepSettings:
    """The sweep: 128-token prompts and answers where the dataset does not set its own; `seed` draws the
    workload's requests and arrivals (the same for every target)."""
    return SweepSettings(levels=levels, requests_per_level=RequestsPerLevel(requests, False, requests),
                         input_len=128, output_len=128, dataset=dataset(workload, trace_requests), slo=slo, seed=seed)


def hardware(machine: Machine) -> Hardware:
    """The machine's groups, split at its `eagle_kv_share` (keeping the launcher's plain KV floor) when it sets one."""
    if machine.eagle_kv_share is None:
        return Hardware(machine.groups, machine.gpus_per_group)
    profile = profile_for(machine.profile, ROOT / machine.profile_file if machine.profile_file else None)
    split = memory_split(profile.memory, machine.gpus_per_group, eagle_kv_share=machine.eagle_kv_share,
                         plain_kv_floor_gb=request_kv_gb(profile))
    if split is None:
        raise SystemExit(f"{machine.label}: the two copies of the weights leave no KV room to split")
    return Hardware(machine.groups, machine.gpus_per_group, split["eagle"], split["plain"])


def spec(machine: Machine, settings: SweepSettings, bounds: tuple[Bound, ...] = ()) -> EnvelopeSpec:
    return EnvelopeSpec(hardware(machine), settings, machine.profile,
                        Path(ROOT / machine.profile_file) if machine.profile_file else None, bounds=bounds,
                        draws="request", routers=routers(machine))


def capacity(machine: Machine, workload: str, seed: int = 0, trace_requests: int = TRACE_REQUESTS) -> float:
    """plain-dp's requests/s on this workload with every request sent at once (behind the balancer)."""
    at_once = level_at(workload, 1e6, trace_requests) if workload == "trace" else Level(request_rate=math.inf)
    settings = settings_for(workload, (at_once,), REQUESTS, seed=seed, trace_requests=trace_requests)
    s = spec(machine, settings)
    _, targets = same_hardware_targets(s.profile, s.profile_file, s.hardware, settings, QuietProgress())
    plain = next(t for t in targets if t.name == "plain-dp")
    (level,) = sweep_target(plain, settings, settings.plans(), QuietProgress(), draws="request")
    stats = level.targets["plain-dp"].stats
    return stats.request_s


@dataclass(frozen=True)
class CellRun:
    """One profile x workload run: plain-dp's capacity, the rates and SLOs it set, the envelope and its spec."""

    capacity: float
    rates: list[float]
    slo: Slo
    bounds: tuple[Bound, ...]
    spec: EnvelopeSpec
    doc: ResultsDocument


def run_cell(machine: Machine, workload: str, seed: int = 0, trace_requests: int = TRACE_REQUESTS) -> CellRun:
    """Capacity, then the SLOs from a light run, then the envelope at every load."""
    cap = capacity(machine, workload, seed, trace_requests)
    rates = [load * cap for load in LOADS]
    light_level = (level_at(workload, rates[0], trace_requests),)
    light = run_envelope(spec(machine, settings_for(workload, light_level, 64, seed=seed, trace_requests=trace_requests)))
    stats = [t.stats for t in light.levels[0].targets.values()]
    slo = Slo(2.0 * min(s.ttft.p50 for s in stats if s.ttft.p50), 1.5 * min(s.tpot.p50 for s in stats if s.tpot.p50))
    bounds = RANDOM_BOUNDS if workload == "random" else PREFIX_BOUNDS
    settings = settings_for(workload, tuple(level_at(workload, r, trace_requests) for r in rates), REQUESTS, slo, seed,
                            trace_requests)
    envelope = spec(machine, settings, bounds)
    return CellRun(cap, rates, slo, bounds, envelope, run_envelope(envelope, command="benchmarks/real_traffic.py"))


def cell(machine: Machine, workload: str, seed: int = 0, trace_requests: int = TRACE_REQUESTS) -> dict[str, Any]:
    """One profile x workload: capacity, SLOs, the envelope at every load, its rows and verdict."""
    began = time.perf_counter()
    run = run_cell(machine, workload, seed, trace_requests)
    doc = run.doc
    return {"machine": machine.label, "workload": workload, "eagle_kv_share": machine.eagle_kv_share,
            "capacity_request_s": run.capacity, "loads": list(LOADS),
            "rates": run.rates, "slo": {"ttft_ms": run.slo.ttft_ms, "tpot_ms": run.slo.tpot_ms}, "levels": _levels(doc),
            "checks": [c.to_json() for c in doc.envelope.checks] if doc.envelope else [],
            "all_met": bool(doc.envelope and doc.envelope.all_met), "seconds": time.perf_counter() - began}


def _levels(doc: ResultsDocument) -> list[dict[str, Any]]:
    rows = []
    for level in doc.levels:
        targets = {}
        for name, result in level.targets.items():
            st = result.stats
            traffic = st.traffic
            targets[name] = {
                "completed": st.completed, "failed": st.failed, "output_tok_s": st.output_tok_s,
                "ttft_p50_ms": st.ttft.p50, "ttft_p99_ms": st.ttft.p99, "tpot_p50_ms": st.tpot.p50,
                "e2e_p50_ms": st.e2e.p50, "e2e_p99_ms": st.e2e.p99,
                "cache_hit_rate": traffic.cache_hit_rate if traffic else None,
                "goodput_request_s": traffic.goodput_request_s if traffic else None,
            }
        rows.append({"label": level.label, "offered_request_s": level.offered_request_s, "targets": targets,
                     "ratios": dict(level.ratios), "best": dict(level.best) if level.best else None})
    return rows


def _run(job: tuple[int, str, int, int, float | None]) -> dict[str, Any]:
    machine_index, workload, seed, trace_requests, eagle_kv_share = job
    machine = replace(MACHINES[machine_index], eagle_kv_share=eagle_kv_share)
    return cell(machine, workload, seed, trace_requests)


def matrix_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every script over this matrix takes: processes, machines, workloads, trace window, split."""
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--machines", default=",".join(str(i) for i in range(len(MACHINES))),
                        help="indices into benchmarks/real_traffic.py's MACHINES")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--trace-requests", type=int, default=TRACE_REQUESTS, help="the trace window: its first requests")
    parser.add_argument("--eagle-kv-share", type=float, default=None,
                        help="EAGLE's share of each co-located group's KV room (default: the launcher's split)")


def run_matrix(args: argparse.Namespace, jobs: list[Any], run: Callable[[Any], dict[str, Any]], script: str,
               argv: Sequence[str] | None, report: Callable[[dict[str, Any]], str]) -> None:
    """`run` over `jobs` in `args.jobs` processes; the cells, the command and the options written to `args.out`
    (OUT.json, and `report`'s OUT.md)."""
    began = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        cells = list(pool.map(run, jobs))
    command = f"python {script} " + " ".join(sys.argv[1:] if argv is None else argv)
    raw, markdown_file = outputs(args.out)
    data = {"command": command.strip(), "seconds": time.perf_counter() - began, "raw": raw.name,
            "trace_requests": args.trace_requests, "eagle_kv_share": args.eagle_kv_share, "cells": cells}
    raw.write_text(json.dumps(data, indent=1))
    markdown_file.write_text(report(data))
    print(f"wrote {markdown_file} and {raw.name} in {data['seconds']:.0f} s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks/real-traffic")
    parser.add_argument("--seed", type=int, default=0, help="draws every workload's requests and arrivals")
    matrix_arguments(parser)
    args = parser.parse_args(argv)
    jobs = [(int(m), w, args.seed, args.trace_requests, args.eagle_kv_share)
            for m in args.machines.split(",") for w in args.workloads.split(",")]
    run_matrix(args, jobs, _run, "benchmarks/real_traffic.py", argv, markdown)


def outputs(out: Path) -> tuple[Path, Path]:
    """The raw data and the report `--out` names: OUT.json and OUT.md (a dot in OUT is part of the name,
    as in `field-kv0.3`; a trailing .json or .md is dropped)."""
    base = out.with_suffix("") if out.suffix in (".json", ".md") else out
    return base.with_name(base.name + ".json"), base.with_name(base.name + ".md")


if __name__ == "__main__":
    main()
