"""The real-traffic matrix's static ceiling: which of specgate's misses one fixed mode per group would meet, on its
own co-located layout: docs/benchmarks/real-traffic-ceiling.md and .json.

    python benchmarks/real_traffic_ceiling.py [--out docs/benchmarks/real-traffic-ceiling] [--seeds 0,1,2,3,4]
                                              [--machines 0,1,2] [--workloads ...] [--jobs 2] [--eagle-kv-share S]

Each cell of `benchmarks/real_traffic.py` (the same capacity, rates, SLOs, bounds and requests per seed) runs as
there, and then specgate's servers (its groups, memory split and EAGLE cap; not its policy) run it again under each
static assignment of `vnode.ceiling`: every group speculating, every group plain, half of the groups each (K >= 2),
each behind the least-in-flight balancer and, for K > 1, behind SMG's cache_aware policy over the same servers
(a request no server of the assignment can hold goes to the least-loaded server that can). Every level of every static run is judged by the cell's bounds against the same baseline runs. A cell is
attainable when each level is met by some static run (an oracle that picks per level and switches for free; open
loop, so each static run's level starts from its own lighter level's state: a yardstick, not a bound). A level met
by none is out of reach of any router that keeps each group in one mode through it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.real_traffic import (  # noqa: E402
    LOADS, MACHINES, TRACE_REQUESTS, matrix_arguments, routers, run_cell, run_matrix,
)
from loadtest.envelope.comparison import Bound, level_ratios  # noqa: E402
from loadtest.results import LevelResult  # noqa: E402
from vnode.ceiling import CellCeiling, judge, static_levels, statics, subject_target  # noqa: E402
from vnode.ceiling_report import letter, verdict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VERDICTS = ("met", "met beyond", "policy", "layout")


def ceiling_cell(machine_index: int, workload: str, seed: int, trace_requests: int = TRACE_REQUESTS,
                 eagle_kv_share: float | None = None) -> dict[str, Any]:
    """One cell at one seed: specgate's verdict per level, the static runs meeting each, and every run's ratios."""
    began = time.perf_counter()
    machine = replace(MACHINES[machine_index], eagle_kv_share=eagle_kv_share)
    run = run_cell(machine, workload, seed, trace_requests)
    subject = subject_target(run.spec, run.doc)
    runs = {s.label: static_levels(subject, run.spec.settings, s, run.spec.smg)
            for s in statics(machine.groups, routers(machine))}
    levels = judge(run.doc, runs, run.bounds)
    ceiling = CellCeiling(machine.label, workload, levels)
    rows = []
    for index, (level, judged) in enumerate(zip(run.doc.levels, levels, strict=True)):
        ratios = {"specgate": _bound_ratios(level.ratios, run.bounds)}
        for label, static in runs.items():
            ratios[label] = _bound_ratios(_in_place(level, static[index], run.doc), run.bounds)
        rows.append({"label": level.label, "load": LOADS[index], "specgate": judged.specgate,
                     "met_by": list(judged.met_by), "ratios": ratios})
    return {"machine": machine.label, "workload": workload, "seed": seed, "eagle_kv_share": eagle_kv_share,
            "verdict": verdict(ceiling), "specgate": ceiling.specgate, "attainable": ceiling.attainable,
            "one_assignment": list(ceiling.one_assignment), "bounds": [[b.name, b.op, b.value] for b in run.bounds],
            "levels": rows,
            "seconds": time.perf_counter() - began}


def _in_place(level: LevelResult, static: LevelResult, doc: Any) -> dict[str, float]:
    """The ratios `level` would have with the static run's subject in specgate's place."""
    comparison = doc.envelope.comparison
    pinned = replace(level, targets={**level.targets, comparison.subject: static.targets[comparison.subject]})
    return level_ratios(pinned, comparison)


def _bound_ratios(ratios: Any, bounds: Sequence[Bound]) -> dict[str, float | None]:
    return {b.name: ratios.get(b.name) for b in bounds}


def _failed(ratios: dict[str, float | None], bounds: Sequence[Bound]) -> list[str]:
    """Each bound `ratios` misses, as `e2e_p50 1.07` (a ratio not measured: `failed`-style `name n/a`)."""
    return [f"{b.name.removesuffix('_ratio')} " + ("n/a" if (value := ratios.get(b.name)) is None else f"{value:.3g}")
            for b in bounds if not b.holds(ratios.get(b.name))]


def markdown(data: dict[str, Any]) -> str:
    """The report: verdicts counted, each cell's verdict per seed, and each missed level's static runs."""
    cells = data["cells"]
    seeds = sorted({c["seed"] for c in cells})
    keys = list(dict.fromkeys((c["machine"], c["workload"]) for c in cells))
    by_key = {(c["machine"], c["workload"], c["seed"]): c for c in cells}
    lines = [
        "# Real traffic: the static ceiling of specgate's layout (vnode)",
        "",
        f"Command: `{data['command']}` ({data['seconds']:.0f} s on this 2-core machine). Raw data: "
        f"[{data['raw']}]({data['raw']}). The matrix itself: [real-traffic.md](real-traffic.md).",
        "",
        "Each cell of the real-traffic matrix (same capacity, rates, SLOs, bounds and requests at each seed) run "
        "again on specgate's own servers (its co-located groups, memory split and EAGLE cap) with a fixed mode "
        "per group instead of its policy: every group speculating (E), every group plain (P), half the groups "
        "each (S, K >= 2), each behind the least-in-flight balancer and, for K > 1, behind SMG's cache_aware "
        "policy over the same servers (+smg); a request that no server of the assignment can hold goes to the "
        "least-loaded server that can, as specgate's policy sends it. Each level of each static run is judged by "
        "the cell's bounds against the same baseline runs as specgate (`benchmarks/real_traffic_ceiling.py`, "
        "`vnode/ceiling.py`).",
        "",
        "- met: specgate meets every bound; met beyond: it does where no static run does at some level;",
        "- policy: specgate misses a cell that some static run per level meets (an oracle choosing per level);",
        "- layout: some level is met by no static run: no router that keeps each group in one mode through "
        "the level meets it on this layout.",
        "",
        "| verdict | " + " | ".join(f"seed {s}" for s in seeds) + " | all |",
        "|---" * (len(seeds) + 2) + "|",
    ]
    for name in VERDICTS:
        counts = [sum(1 for c in cells if c["seed"] == s and c["verdict"] == name) for s in seeds]
        lines.append(f"| {name} | " + " | ".join(str(n) for n in counts) + f" | {sum(counts)} |")
    lines += ["", "| cell | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for machine, workload in keys:
        row = [by_key[(machine, workload, s)]["verdict"] if (machine, workload, s) in by_key else "" for s in seeds]
        lines.append(f"| {machine}, {workload} | " + " | ".join(row) + " |")
    lines += ["", "## Missed levels", "",
              "Each level specgate missed or no static run met: the static runs that meet it, and what specgate "
              "(and, where none meets it, the nearest static run: fewest bounds missed) missed by.", ""]
    for cell in cells:
        if cell["specgate"]:
            continue
        bounds = [Bound(name, op, value) for name, op, value in cell["bounds"]]
        shown = []
        for lv in cell["levels"]:
            if lv["specgate"] and lv["met_by"]:
                continue
            text = f"{lv['load']:.0%}: " + (" ".join(letter(a) for a in lv["met_by"]) or "none")
            if not lv["specgate"]:
                text += " (specgate: " + ", ".join(_failed(lv["ratios"]["specgate"], bounds)) + ")"
            if not lv["met_by"]:
                label, misses = min(((label, _failed(r, bounds)) for label, r in lv["ratios"].items()
                                     if label != "specgate"), key=lambda item: (len(item[1]), item[0]))
                text += f" nearest {letter(label)}: " + ", ".join(misses)
            shown.append(text)
        lines.append(f"- {cell['machine']}, {cell['workload']}, seed {cell['seed']} ({cell['verdict']}): "
                     + "; ".join(shown))
    return "\n".join(lines) + "\n"


def _run(job: tuple[int, str, int, int, float | None]) -> dict[str, Any]:
    return ceiling_cell(*job)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks/real-traffic-ceiling")
    parser.add_argument("--seeds", default="0", help="comma-separated: each draws every workload's requests and arrivals")
    matrix_arguments(parser)
    args = parser.parse_args(argv)
    jobs = [(int(m), w, int(seed), args.trace_requests, args.eagle_kv_share) for seed in args.seeds.split(",")
            for m in args.machines.split(",") for w in args.workloads.split(",")]
    run_matrix(args, jobs, _run, "benchmarks/real_traffic_ceiling.py", argv, markdown)


if __name__ == "__main__":
    main()
