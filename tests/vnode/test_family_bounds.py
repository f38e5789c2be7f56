"""The family sweep against its committed results (docs/benchmarks/vnode-family.json).

The model is deterministic (virtual time, each request's own acceptance draws), so a cell's ratios
move only when the routing or the model changes. The default suite runs a sample of cells that meet
every bound and asserts the bounds; the `family` marker runs every cell and holds each to what was
committed: a cell that met every bound still does, and no ratio is worse than committed by more
than `SLACK`. A change that moves them on purpose re-runs the command in the report's first line
and commits its output.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from loadtest.verdicts import BoundCheck
from vnode.family import Member, family
from vnode.family_sweep import WORKLOADS, Cell, run_cell, run_family

COMMITTED = Path(__file__).resolve().parents[2] / "docs/benchmarks/vnode-family.json"
SLACK = 0.02  # relative: a worse ratio than this is a regression

# Cells that meet every bound, one per kind of workload and axis: one group under Poisson arrivals, a
# crossover of 32 through a rate step, K=4 closed loop at drawn lengths, gamma bursts where EAGLE never pays,
# and a crossover of 2 through a rate step (its groups, plain past EAGLE's measured reach, stay plain).
SAMPLE = [("x4-s2-line-k1", "poisson"), ("x32-s2-line-k1", "step"), ("x4-s2-line-k4", "closed-uniform"), ("x1-s0.9-line-k2", "gamma"),
          ("x2-s1.2-line-k2", "step")]


def committed() -> dict[tuple[str, str], list[BoundCheck]]:
    raw = orjson.loads(COMMITTED.read_bytes())
    return {(c["member"], c["workload"]): [BoundCheck.from_json(k) for k in c["checks"]] for c in raw["cells"]}


def regressions(cell: Cell, before: list[BoundCheck]) -> list[str]:
    """Each way `cell` is worse than the committed checks `before`."""
    out = []
    for old in before:
        new = next(c for c in cell.checks if c.name == old.name)
        if old.met and not new.met:
            out.append(f"{cell.member} {cell.workload}: {new.name} met before, now {new.worst} at {new.where}")
        elif old.worst is not None and new.worst is not None and old.name != "failed_requests":
            worse = new.worst < old.worst * (1 - SLACK) if old.op == ">=" else new.worst > old.worst * (1 + SLACK)
            if worse:
                out.append(f"{cell.member} {cell.workload}: {new.name} {old.worst:.3f} -> {new.worst:.3f} at {new.where}")
        elif old.name == "failed_requests" and (new.worst or 0) > (old.worst or 0):
            out.append(f"{cell.member} {cell.workload}: {new.worst} failed requests, {old.worst} before")
    return out


def test_the_committed_sweep_is_the_default_family_under_every_workload() -> None:
    cells = committed()
    assert set(cells) == {(m.name, w) for m in family() for w in WORKLOADS}
    assert all((m, w) in cells and all(c.met for c in cells[(m, w)]) for m, w in SAMPLE)


@pytest.mark.parametrize(("member", "workload"), SAMPLE, ids=["-".join(c) for c in SAMPLE])
def test_a_sample_of_the_family_meets_every_bound(member: str, workload: str) -> None:
    cell = run_cell(Member.parse(member), WORKLOADS[workload])
    assert [c for c in cell.checks if not c.met] == []
    assert regressions(cell, committed()[(member, workload)]) == []


@pytest.mark.family
@pytest.mark.timeout(3600)  # 174 cells: minutes, past the suite's per-test limit
def test_no_cell_of_the_family_is_worse_than_committed() -> None:
    cells = run_family(family(), list(WORKLOADS), jobs=len(os.sched_getaffinity(0)))
    before = committed()
    found = [line for cell in cells for line in regressions(cell, before[(cell.member, cell.workload)])]
    assert found == [], "\n".join(found)
