"""The static ceiling for people and files: which of specgate's misses a fixed mode per level would meet."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from vnode.ceiling import CellCeiling, LevelCeiling

_LETTER = {"eagle": "E", "plain": "P", "split": "S"}


def verdict(cell: CellCeiling) -> str:
    """`met`, `met beyond` (specgate met a cell no static assignment does), `policy` (it missed a cell some
    assignment per level meets) or `layout` (no assignment meets some level)."""
    if cell.specgate:
        return "met" if cell.attainable else "met beyond"
    return "policy" if cell.attainable else "layout"


def letter(label: str) -> str:
    """A static run's short name: `P` for `plain`, `S+smg` for `split+smg`."""
    assignment, smg, _ = label.partition("+smg")
    return _LETTER[assignment] + ("+smg" if smg else "")


def level_text(level: LevelCeiling) -> str:
    """`C=64: P S` (the static runs meeting the level; `none`), with `specgate missed` where it did."""
    met = " ".join(letter(a) for a in level.met_by) or "none"
    return f"{level.label}: {met}" + ("" if level.specgate else " (specgate missed)")


def ceiling_json(cells: Sequence[CellCeiling], seconds: float) -> bytes:
    return orjson.dumps({"seconds": seconds, "cells": [c.to_json() for c in cells]}, option=orjson.OPT_INDENT_2)


def ceiling_markdown(cells: Sequence[CellCeiling], seconds: float, command: str) -> str:
    """The report: the command, the verdicts counted per workload, the member x workload table, and each
    missed cell's levels (which assignments meet each level specgate missed or no assignment meets)."""
    workloads = list(dict.fromkeys(c.workload for c in cells))
    by_member: dict[str, dict[str, CellCeiling]] = {}
    for cell in cells:
        by_member.setdefault(cell.member, {})[cell.workload] = cell
    kinds = ("met", "met beyond", "policy", "layout")
    lines = [
        "# The family's static ceiling in virtual time",
        "",
        f"Command: `{command}` ({len(by_member)} members x {len(workloads)} workloads, {seconds:.0f} s)",
        "",
        "specgate's own layout (its co-located groups, memory split and EAGLE cap) run with one fixed mode "
        "assignment behind a least-in-flight balancer: every group speculating (E), every group plain (P), "
        "half of the groups each (S, K >= 2). Each level of each run is judged by the workload's bounds "
        "against the same baseline runs as specgate (`vnode/ceiling.py`). A cell is attainable when each "
        "level is met by some assignment (an oracle choosing per level, switching between levels for free).",
        "",
        "- met: specgate meets every bound; met beyond: it does where no assignment does;",
        "- policy: specgate misses a cell that a fixed assignment per level meets;",
        "- layout: some level is met by no assignment (the co-located layout, or bounds no one mode meets together).",
        "",
        "| workload | " + " | ".join(kinds) + " |",
        "|---" * (len(kinds) + 1) + "|",
    ]
    for name in [*workloads, "all"]:
        mine = [c for c in cells if name in ("all", c.workload)]
        lines.append(f"| {name} | " + " | ".join(str(sum(1 for c in mine if verdict(c) == k)) for k in kinds) + " |")
    lines += ["", "| member | " + " | ".join(workloads) + " |", "|---" * (len(workloads) + 1) + "|"]
    for member, row in by_member.items():
        lines.append(f"| {member} | " + " | ".join(verdict(row[w]) if w in row else "" for w in workloads) + " |")
    lines += ["", "## Missed cells, level by level", ""]
    for cell in cells:
        if cell.specgate:
            continue
        shown = [level_text(lv) for lv in cell.levels if not lv.specgate or not lv.met_by]
        lines.append(f"- {cell.member} {cell.workload} ({verdict(cell)}): " + "; ".join(shown))
    return "\n".join(lines) + "\n"
