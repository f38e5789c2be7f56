"""Two family sweeps compared: verdicts that changed, each ratio's move in its bound's direction, pooled pairs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadtest.verdicts import BoundCheck
from vnode.cli import main
from vnode.family_compare import compare, comparison_lines, load_cells
from vnode.family_report import cells_json
from vnode.family_sweep import Cell


def _closed(member: str, throughput: float, tpot: float, failed: int = 0) -> Cell:
    return Cell(member, "closed", (
        BoundCheck("throughput_ratio", ">=", 0.97, throughput >= 0.97, throughput, 8, "C=8"),
        BoundCheck("tpot_ratio", "<=", 1.03, tpot <= 1.03, tpot, 8, "C=8"),
        BoundCheck("failed_requests", "<=", 0.0, failed == 0, failed, 1, "C=1"),
    ), 1.0)


def _open(member: str, p50: float, p99: float) -> Cell:
    return Cell(member, "poisson", (
        BoundCheck("e2e_p50_ratio", "<=", 1.05, p50 <= 1.05, p50, 10.0, "10/s"),
        BoundCheck("e2e_p99_ratio", "<=", 1.10, p99 <= 1.10, p99, 10.0, "10/s"),
    ), 1.0)


BEFORE = [_closed("a", 0.90, 1.00), _closed("b", 0.99, 1.01), _open("a", 1.00, 1.20), _closed("gone", 1.0, 1.0)]
AFTER = [_closed("a", 0.99, 1.00), _closed("b", 0.99, 1.10, failed=3), _open("a", 1.20, 1.00), _closed("new", 1.0, 1.0)]


def test_ratios_move_in_their_bounds_direction_and_verdict_changes_are_named() -> None:
    result = compare([(BEFORE, AFTER)])
    pair = result.pairs[0]
    assert (pair.met_before, pair.met_after, pair.compared, pair.unmatched) == (1, 1, 3, 2)
    assert pair.gained == (("a", "closed"),) and pair.lost == (("b", "closed"),)
    assert pair.failed == ("b closed: failed requests 0 -> 3",)
    changes = {(m.member, m.workload, m.bound): m.change for m in result.moves}
    assert len(changes) == 6  # failed requests are not a ratio
    assert changes["a", "closed", "throughput_ratio"] == pytest.approx(0.99 / 0.90)  # higher throughput: better
    assert changes["b", "closed", "tpot_ratio"] == pytest.approx(1.01 / 1.10)  # higher TPOT: worse
    assert changes["a", "poisson", "e2e_p50_ratio"] == pytest.approx(1.00 / 1.20)
    assert changes["a", "poisson", "e2e_p99_ratio"] == pytest.approx(1.20 / 1.00)
    assert (result.better, result.worse) == (2, 2)  # the unchanged ratios are neither
    means = result.geometric_means()
    assert means["closed", "throughput_ratio"] == pytest.approx(math.sqrt(0.99 / 0.90))
    largest = result.largest()  # beyond 5% either way, the largest first
    assert len(largest) == 4 and {m.bound for m in largest[:2]} == {"e2e_p50_ratio", "e2e_p99_ratio"}


def test_pairs_pool_their_ratios_and_keep_their_own_verdicts() -> None:
    one = compare([(BEFORE, AFTER)])
    two = compare([(BEFORE, AFTER), (AFTER, BEFORE)])
    assert len(two.moves) == 2 * len(one.moves) and (two.better, two.worse) == (4, 4)
    assert all(mean == pytest.approx(1.0) for mean in two.geometric_means().values())  # there and back
    assert two.pairs[1].gained == (("b", "closed"),) and two.pairs[1].lost == (("a", "closed"),)
    lines = comparison_lines(two, [("s0-before", "s0-after")])
    assert lines[0].startswith("- s0-before -> s0-after: 1 -> 1 of 3 cells") and "2 cells in one sweep only" in lines[0]
    assert any(line.startswith("- pair 2: ") for line in lines)
    assert "- worst-level ratios better by over 2%: 4, worse by over 2%: 4 (of 12)" in lines


def test_a_threshold_decides_what_counts_as_moved() -> None:
    assert (compare([(BEFORE, AFTER)], threshold=0.15).better, compare([(BEFORE, AFTER)], threshold=0.15).worse) == (1, 1)


def test_the_command_reads_sweep_files_in_pairs(tmp_path: Path) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_bytes(cells_json(BEFORE, 1.0))
    after.write_bytes(cells_json(AFTER, 1.0))
    assert load_cells(before) == BEFORE
    report = tmp_path / "compare.md"
    result = CliRunner().invoke(main, ["family-compare", str(before), str(after), "--markdown", str(report)])
    assert result.exit_code == 0, result.output
    assert "before.json -> after.json: 1 -> 1 of 3 cells meet every bound" in result.output
    assert "  - lost: b closed" in result.output and "a closed throughput_ratio: 0.900 -> 0.990" in result.output
    text = report.read_text()
    assert text.startswith("# Family sweeps compared")
    assert f"python -m vnode family-compare --threshold 0.02 --markdown {report} {before} {after}`" in text  # replayable
    odd = CliRunner().invoke(main, ["family-compare", str(before)])
    assert odd.exit_code == 2 and "sweeps come in pairs" in odd.output
