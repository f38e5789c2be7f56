"""The family sweep's verdict for people and files: a member x workload table, the failures in words, JSON."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def _cell(cell: Cell, marked: Callable[[str], str], failures: str) -> str:
    """The worst ratio of each bound but failures, joined by ` / `, `marked` where a bound fails; `failures`
    (a format of the count) where requests failed."""
    ratios = [c for c in cell.checks if c.name != FAILED]
    text = " / ".join(marked(_figure(c)) if not c.met else _figure(c) for c in ratios)
    failed = next((c for c in cell.checks if c.name == FAILED), None)
    if failed is not None and not failed.met:
        text += failures.format(_figure(failed))
    return text


def cell_text(cell: Cell) -> str:
    """`0.981 / 1.012` (the worst ratio of each bound but failures; `+3 failed` where requests failed), red where a bound fails."""
    return _cell(cell, lambda figure: f"[red]{figure}[/]", " [red]+{} failed[/]")


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


def _md_cell(cell: Cell) -> str:
    return _cell(cell, lambda figure: f"**{figure}**", " (+{} failed)") + (" ✓" if not cell.failed else "")


def family_markdown(cells: Sequence[Cell], seconds: float, command: str) -> str:
    """The sweep as a committed report: the command, cells meeting every bound per workload, the member x
    workload table of worst ratios (bold where a bound fails, ✓ where the cell meets them all), the failures."""
    workloads = list(dict.fromkeys(c.workload for c in cells))
    by_member: dict[str, dict[str, Cell]] = {}
    for cell in cells:
        by_member.setdefault(cell.member, {})[cell.workload] = cell
    lines = [
        "# The profile family in virtual time",
        "",
        f"Command: `{command}` ({len(by_member)} members x {len(workloads)} workloads, {seconds:.0f} s)",
        "",
        "Each cell: specgate's worst ratio per bound over the workload's levels against the best data-parallel "
        "baseline on the same GPUs (closed loop: throughput >= 0.97 / TPOT p50 <= 1.03; open loop: "
        "E2E p50 <= 1.05 / E2E p99 <= 1.10; no failed request). Bold: the bound fails; ✓: every bound holds.",
        "",
        "| workload | cells meeting every bound |",
        "|---|---|",
    ]
    for name in workloads:
        mine = [c for c in cells if c.workload == name]
        lines.append(f"| {name} | {sum(1 for c in mine if not c.failed)} of {len(mine)} |")
    lines.append(f"| all | {sum(1 for c in cells if not c.failed)} of {len(cells)} |")
    lines += ["", "| member | " + " | ".join(workloads) + " |", "|---" * (len(workloads) + 1) + "|"]
    for member, row in by_member.items():
        lines.append(f"| {member} | " + " | ".join(_md_cell(row[w]) if w in row else "" for w in workloads) + " |")
    lines += ["", "## Failures, worst level per bound", ""]
    lines += [f"- {line}" for line in failures_text(cells)[:-1]] or ["- none"]
    return "\n".join(lines) + "\n"
