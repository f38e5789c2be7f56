"""The family sweep's verdict for people and files: a member x workload table, the failures in words, JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from rich.table import Table

from loadtest.envelope.comparison import FAILED
from loadtest.verdicts import BoundCheck
from vnode.family_sweep import Cell

_SHORT = {"throughput_ratio": "tput", "tpot_ratio": "TPOT", "e2e_p50_ratio": "E2E p50", "e2e_p99_ratio": "E2E p99",
          FAILED: "failed"}


def _figure(check: BoundCheck) -> str:
    if check.worst is None:
        return "-"
    return f"{check.worst:.0f}" if check.name == FAILED else f"{check.worst:.3f}"


def cell_text(cell: Cell) -> str:
    """`0.981 / 1.012` (the worst ratio of each bound but failures; `+3 failed` where requests failed), red where a bound fails."""
    ratios = [c for c in cell.checks if c.name != FAILED]
    text = " / ".join(f"[red]{_figure(c)}[/]" if not c.met else _figure(c) for c in ratios)
    failed = next((c for c in cell.checks if c.name == FAILED), None)
    if failed is not None and not failed.met:
        text += f" [red]+{_figure(failed)} failed[/]"
    return text


def family_table(cells: Sequence[Cell]) -> Table:
    """Members down, workloads across: each cell's worst ratios (closed loop: throughput / TPOT p50; open loop:
    E2E p50 / E2E p99), red where the bound fails."""
    workloads = list(dict.fromkeys(c.workload for c in cells))
    table = Table(title="Family sweep: specgate's worst ratio per bound against the best data-parallel baseline")
    table.add_column("member")
    for name in workloads:
        table.add_column(name, justify="right")
    by_member: dict[str, dict[str, Cell]] = {}
    for cell in cells:
        by_member.setdefault(cell.member, {})[cell.workload] = cell
    for member, row in by_member.items():
        table.add_row(member, *(cell_text(row[w]) if w in row else "" for w in workloads))
    table.caption = ("closed loop: throughput >= 0.97 / TPOT p50 <= 1.03; open loop: E2E p50 <= 1.05 / E2E p99 <= 1.10; "
                     "no failed request")
    return table


def failures_text(cells: Sequence[Cell]) -> list[str]:
    """One line per cell that fails a bound: which bounds, how badly, at which level."""
    lines = []
    for cell in cells:
        failed = [f"{_SHORT[c.name]} {_figure(c)} at {c.where}" for c in cell.failed]
        if failed:
            lines.append(f"FAIL {cell.member} {cell.workload}: " + ", ".join(failed))
    passed = sum(1 for cell in cells if not cell.failed)
    lines.append(f"{passed} of {len(cells)} member x workload cells meet every bound")
    return lines


def cells_json(cells: Sequence[Cell], seconds: float) -> bytes:
    """Every cell's checks, and the sweep's run time."""
    out: dict[str, Any] = {
        "seconds": seconds,
        "cells": [{"member": c.member, "workload": c.workload, "seconds": c.seconds,
                   "checks": [check.to_json() for check in c.checks]} for c in cells],
    }
    return orjson.dumps(out, option=orjson.OPT_INDENT_2)
