"""Real-traffic results over several seeds, and a policy change judged on them: docs/benchmarks/real-traffic-seeds.md.

    python benchmarks/real_traffic_seeds.py --after A.json [A2.json ...] [--before B.json ...] [--out FILE]

Each file is a `benchmarks/real_traffic.py` result (one seed, any cells). One seed's verdict on a bound
such as TTFT p50 <= 1.10x can read either side of a gap (docs/benchmarks/real-traffic-notes.md), so a
change is judged over seeds: per profile and workload, how many cells meet every bound, and over every
level of every seed the geometric mean of specgate's ratios to the best baseline (throughput, TTFT p50,
E2E p50, E2E p99) with the worst one, its goodput against the best baseline's (the geometric mean over
levels where some target has any) and its mean cache hit rate. With `--before`, both sets side by side,
over the cells present in both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.output import publish  # noqa: E402

RATIOS = (("throughput_ratio", "tok/s", min), ("ttft_p50_ratio", "TTFT p50", max),
          ("e2e_p50_ratio", "E2E p50", max), ("e2e_p99_ratio", "E2E p99", max))


@dataclass(frozen=True)
class Summary:
    """One profile x workload over its seeds."""

    cells: int
    met: int
    ratios: dict[str, tuple[float, float]]  # name -> (geometric mean, worst)
    goodput: float  # geometric mean of specgate's goodput over the best baseline's
    cache_hit: float


def cells(paths: Iterable[Path]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every result file's cells, by (profile, workload)."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in paths:
        for cell in json.loads(path.read_text())["cells"]:
            out.setdefault((cell["machine"], cell["workload"]), []).append(cell)
    return out


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summarize(seeds: list[dict[str, Any]]) -> Summary:
    """One profile x workload's cells, one per seed."""
    levels = [level for cell in seeds for level in cell["levels"]]
    ratios = {}
    for name, _, worst in RATIOS:
        values = [level["ratios"][name] for level in levels]
        ratios[name] = (_geomean(values), worst(values))
    goodput, hit = [], []
    for level in levels:
        targets = level["targets"]
        ours = targets["specgate"]
        best = max((t["goodput_request_s"] or 0.0) for name, t in targets.items() if name != "specgate")
        if best > 0.0 and ours["goodput_request_s"]:
            goodput.append(ours["goodput_request_s"] / best)
        if ours["cache_hit_rate"] is not None:
            hit.append(ours["cache_hit_rate"])
    return Summary(len(seeds), sum(bool(cell["all_met"]) for cell in seeds), ratios, _geomean(goodput),
                   sum(hit) / len(hit) if hit else math.nan)


def _row(label: str, s: Summary) -> str:
    ratios = " | ".join(f"{mean:.3f} ({worst:.3f})" for mean, worst in s.ratios.values())
    return f"| {label} | {s.met} / {s.cells} | {ratios} | {s.goodput:.3f} | {s.cache_hit:.3f} |"


def markdown(after: dict[tuple[str, str], list[dict[str, Any]]], before: dict[tuple[str, str], list[dict[str, Any]]] | None,
             command: str) -> str:
    """The report: one row per profile x workload (two with `before`: before, then after)."""
    head = ("| cell | cells meeting every bound | " + " | ".join(f"{label}: mean (worst)" for _, label, _ in RATIOS)
            + " | goodput / best | cache hit |")
    lines = ["# Real traffic over seeds", "", f"Command: `{command}`", "",
             "Per profile and workload, over its seeds: the cells meeting every bound, and over every level of every "
             "seed the geometric mean of specgate's ratio to the best baseline with the worst one (tok/s: the lowest), "
             "its goodput over the best baseline's (geometric mean) and its mean cache hit rate.", "",
             head, "|---" * (4 + len(RATIOS)) + "|"]
    for key in sorted(after):
        label = f"{key[0]}, {key[1]}"
        if before is None:
            lines.append(_row(label, summarize(after[key])))
        elif key in before:
            lines.append(_row(label + ": before", summarize(before[key])))
            lines.append(_row(label + ": after", summarize(after[key])))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after", type=Path, nargs="+", required=True, help="result files of the code judged")
    parser.add_argument("--before", type=Path, nargs="*", help="result files of the code it changes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    command = "python benchmarks/real_traffic_seeds.py " + " ".join(
        f"--{name} " + " ".join(str(p) for p in paths) for name, paths in (("after", args.after), ("before", args.before)) if paths
    ) + (f" --out {args.out}" if args.out else "")
    publish(markdown(cells(args.after), cells(args.before) if args.before else None, command), args.out)


if __name__ == "__main__":
    main()
