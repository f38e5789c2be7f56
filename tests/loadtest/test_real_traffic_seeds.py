"""benchmarks/real_traffic_seeds.py: a profile x workload summarized over seeds, and the before/after report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.real_traffic_seeds import cells, markdown, summarize


def target(goodput: float | None, hit: float | None = 0.5) -> dict[str, Any]:
    return {"goodput_request_s": goodput, "cache_hit_rate": hit}


def level(throughput: float, ttft: float, ours: float, best: float, hit: float) -> dict[str, Any]:
    ratios = {"throughput_ratio": throughput, "ttft_p50_ratio": ttft, "e2e_p50_ratio": 1.0, "e2e_p99_ratio": 1.0}
    return {"ratios": ratios, "targets": {"specgate": target(ours, hit), "plain-dp": target(best), "eagle-dp": target(best / 2)}}


def cell(met: bool, *levels: dict[str, Any], workload: str = "multi-turn") -> dict[str, Any]:
    return {"machine": "llama8b-h100 K=8", "workload": workload, "all_met": met, "levels": list(levels)}


def test_a_cell_over_seeds_takes_geometric_means_and_the_worst_level() -> None:
    seeds = [cell(True, level(1.0, 1.0, 4.0, 8.0, 0.8)), cell(False, level(0.9, 1.21, 9.0, 9.0, 0.6), level(1.0, 1.0, 0.0, 0.0, 0.7))]
    s = summarize(seeds)
    assert (s.cells, s.met) == (2, 1)
    assert s.ratios["ttft_p50_ratio"] == (pytest.approx(1.21 ** (1 / 3)), 1.21)
    assert s.ratios["throughput_ratio"] == (pytest.approx(0.9 ** (1 / 3)), 0.9)  # tok/s: its lowest is the worst
    # Goodput over the best baseline's (not EAGLE DP's half): 0.5 and 1.0; a level none has any of is left out.
    assert s.goodput == pytest.approx(math.sqrt(0.5))
    assert s.cache_hit == pytest.approx(0.7)


def test_the_report_sets_each_cell_before_above_after_over_the_cells_both_hold(tmp_path: Path) -> None:
    def write(name: str, *cs: dict[str, Any]) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"command": "x", "cells": list(cs)}))
        return path

    before = cells([write("b0.json", cell(False, level(1.0, 1.2, 1.0, 2.0, 0.5)))])
    after = cells([write("a0.json", cell(True, level(1.0, 1.0, 2.0, 2.0, 0.9))),
                   write("a1.json", cell(True, level(1.0, 1.0, 2.0, 2.0, 0.9), workload="trace"))])
    rows = [line for line in markdown(after, before, "cmd").splitlines() if line.startswith("| llama")]
    assert [r.split(" | ")[0] for r in rows] == ["| llama8b-h100 K=8, multi-turn: before", "| llama8b-h100 K=8, multi-turn: after"]
    assert rows[0].split(" | ")[1] == "0 / 1" and rows[1].split(" | ")[1] == "1 / 1"
    assert rows[1].endswith("| 1.000 | 0.900 |")
