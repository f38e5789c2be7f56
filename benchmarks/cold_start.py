"""Benchmark: a gateway that starts under load (a restart or a new deployment at peak traffic), in virtual time.

Every committed envelope starts each target at its lightest level, where specgate's policy measures EAGLE
on a few requests at a time before the load rises. Here each cell is one long open-loop level at a share
of plain-dp's capacity on a fresh node and gateway, nothing learned before: specgate against plain-dp,
eagle-dp and adaptive-dp on the same GPUs (behind the least-in-flight balancer and, for K > 1, SMG's
cache_aware router), each request's own acceptance draws. Workloads: random prompts, multi-turn chat, and
the Mooncake conversation trace (its first `--trace-requests`, each sent once on the trace's own schedule
scaled to the level's rate: long prompts, about 12,000 tokens on average). Per cell: each target's output
tok/s, TPOT p50, E2E p50 and p99, specgate's ratio to the best baseline and the share of its requests that
speculated; with `--before`, the same figures from an earlier run (another policy) beside them.

    python benchmarks/cold_start.py [--out docs/benchmarks/cold-start] [--requests 4096] [--trace-requests 512] \
      [--workloads random,multi-turn,trace] [--machines 0,1,2] [--loads 0.5,0.9] [--seed 0] [--jobs 2] [--before OLD.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.real_traffic import MACHINES, capacity, level_at, outputs, settings_for, spec  # noqa: E402
from vnode.envelope import run_envelope  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOADS = (0.5, 0.9)
WORKLOADS = ("random", "multi-turn", "trace")
TRACE_REQUESTS = 512
SPECGATE = "specgate"


def cell(machine_index: int, workload: str, load: float, requests: int, trace_requests: int = TRACE_REQUESTS,
         seed: int = 0) -> dict[str, Any]:
    """One profile x workload x load: a single level of `requests` from a cold start (the trace: its first
    `trace_requests`, each once); `seed` draws the requests, arrivals and acceptance."""
    machine = MACHINES[machine_index]
    began = time.perf_counter()
    if workload == "trace":
        requests = trace_requests
    rate = load * capacity(machine, workload, seed=seed, trace_requests=trace_requests)
    level = level_at(workload, rate, trace_requests)
    doc = run_envelope(spec(machine, settings_for(workload, (level,), requests, seed=seed, trace_requests=trace_requests)),
                       command="benchmarks/cold_start.py")
    (level,) = doc.levels
    targets = {}
    for name, result in level.targets.items():
        st = result.stats
        share = st.backend_share or {}
        targets[name] = {"output_tok_s": st.output_tok_s, "tpot_p50_ms": st.tpot.p50, "e2e_p50_ms": st.e2e.p50,
                         "e2e_p99_ms": st.e2e.p99, "failed": st.failed,
                         "speculated": sum(v for k, v in share.items() if "eagle" in k) if share else None}
    return {"machine": machine.label, "workload": workload, "load": load, "seed": seed, "request_s": rate, "requests": requests,
            "targets": targets, "ratios": dict(level.ratios), "best": dict(level.best) if level.best else None,
            "seconds": time.perf_counter() - began}


def _run(job: tuple[int, str, float, int, int, int]) -> dict[str, Any]:
    return cell(*job)


def _key(c: dict[str, Any]) -> tuple[str, str, float]:
    return c["machine"], c["workload"], c["load"]


def markdown(data: dict[str, Any], before: dict[str, Any] | None) -> str:
    """The report: per cell specgate against the best baseline (and, given, the earlier run's specgate),
    then every target's figures."""
    earlier = {_key(c): c for c in before["cells"]} if before else {}
    sources = f"Raw data: [{data['raw']}]({data['raw']})"
    if before:
        sources += f"; before: `{before['command']}` on an earlier policy, raw [{data['before']}]({data['before']})"
    sizes = {c["workload"]: c["requests"] for c in data["cells"]}
    size = ", ".join(f"{n} ({w})" for w, n in sizes.items())
    lines = ["# A gateway started under load (vnode)", "",
             f"Command: `{data['command']}` ({data['seconds']:.0f} s on this 2-core machine). {sources}.", "",
             ("Each cell is one open-loop level at a share of plain-dp's capacity on that workload (Poisson arrivals; "
              f"the trace on its own schedule, scaled to the rate) of {size} requests, on a fresh node and gateway: "
              "nothing was learned at a lighter "
              "load first. Ratios are specgate's to the best baseline (plain-dp, eagle-dp, adaptive-dp, behind the "
              "least-in-flight balancer and, for K > 1, SMG's cache_aware router); speculated: the share of its "
              "requests decoded on EAGLE servers. Latencies in model ms."), "",
             ("| profile | workload | load | specgate tok/s / best | TPOT p50 ms: specgate / best (who) | E2E p50 ratio "
              "| E2E p99 ratio | speculated |" + (" before: tok/s ratio, TPOT p50, E2E p50 ratio, speculated |" if before else "")),
             "|---|---|---|---|---|---|---|---|" + ("---|" if before else "")]
    for c in data["cells"]:
        t, r = c["targets"], c["ratios"]
        baselines = {k: v for k, v in t.items() if k != SPECGATE}
        fastest = min(baselines, key=lambda k: baselines[k]["tpot_p50_ms"])
        s = t[SPECGATE]
        row = (f"| {c['machine']} | {c['workload']} | {c['load']:.0%} | {r['throughput_ratio']:.3f} | "
               f"{s['tpot_p50_ms']:.2f} / {baselines[fastest]['tpot_p50_ms']:.2f} ({fastest}) | {r['e2e_p50_ratio']:.3f} | "
               f"{r['e2e_p99_ratio']:.3f} | {s['speculated']:.2f} |")
        if before:
            old = earlier.get(_key(c))
            if old is None:
                row += " - |"
            else:
                o, orr = old["targets"][SPECGATE], old["ratios"]
                row += (f" {orr['throughput_ratio']:.3f}, {o['tpot_p50_ms']:.2f}, {orr['e2e_p50_ratio']:.3f}, "
                        f"{o['speculated']:.2f} |")
        lines.append(row)
    lines += ["", "Every target, every cell:", "", "| profile | workload | load | target | tok/s | TPOT p50 | E2E p50 | E2E p99 | failed |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in data["cells"]:
        for name, t in c["targets"].items():
            lines.append(f"| {c['machine']} | {c['workload']} | {c['load']:.0%} | {name} | {t['output_tok_s']:.1f} | "
                         f"{t['tpot_p50_ms']:.2f} | {t['e2e_p50_ms']:.1f} | {t['e2e_p99_ms']:.1f} | {t['failed']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks/cold-start")
    parser.add_argument("--requests", type=int, default=4096, help="per cell (its one level)")
    parser.add_argument("--trace-requests", type=int, default=TRACE_REQUESTS, help="the trace's cells: its first requests")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of " + ", ".join(WORKLOADS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--machines", default=",".join(str(i) for i in range(len(MACHINES))), help="indices into MACHINES")
    parser.add_argument("--before", type=Path, default=None, help="an earlier run's JSON to show beside")
    parser.add_argument("--loads", default=",".join(str(load) for load in LOADS), help="shares of plain-dp's capacity")
    parser.add_argument("--seed", type=int, default=0, help="draws every cell's requests, arrivals and acceptance")
    args = parser.parse_args(argv)
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    jobs = [(int(m), w, float(load), args.requests, args.trace_requests, args.seed)
            for m in args.machines.split(",") for w in workloads for load in args.loads.split(",")]
    began = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        cells = list(pool.map(_run, jobs))
    command = "python benchmarks/cold_start.py " + " ".join(sys.argv[1:] if argv is None else argv)
    raw, report = outputs(args.out)
    data = {"command": command.strip(), "seconds": time.perf_counter() - began, "raw": raw.name, "seed": args.seed,
            "before": args.before.name if args.before else None, "cells": cells}
    before = json.loads(args.before.read_text()) if args.before else None
    raw.write_text(json.dumps(data, indent=1))
    report.write_text(markdown(data, before))
    print(f"wrote {report} and {raw.name} in {data['seconds']:.0f} s")


if __name__ == "__main__":
    main()
