"""The same-hardware comparison's math on plain typed data: best baseline, and TPOT only among those carrying the load."""

from __future__ import annotations

import pytest

from loadtest.envelope.comparison import (
    CARRYING_WITHIN,
    LEGACY_COMPARISON,
    Bound,
    add_ratios,
    best_baselines,
    envelope_markdown,
)
from backends.resolve import PlanError
from loadtest.envelope.fair import Hardware, eagle_dp_cap, merge_levels, specgate_config
from loadtest.envelope.harness import StackSettings
from loadtest.report import build_document
from loadtest.results import LevelResult, ResultsDocument
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings, Target
from loadtest.verdicts import Comparison
from tests.loadtest.test_report import target_level

FAIR = Comparison("specgate", ("plain-dp", "eagle-dp", "adaptive-dp"), CARRYING_WITHIN, "same-hardware")
SETTINGS = SweepSettings(levels=(Level(concurrency=8),), requests_per_level=RequestsPerLevel(1, True),
                         input_len=8, output_len=100)
TARGETS = [Target(n, f"http://{n}") for n in ("plain-dp", "eagle-dp", "adaptive-dp", "specgate")]


def level(adaptive_tok_s: float) -> LevelResult:
    # tok/s = 100 tokens / seconds; TPOT p50 = the gap between tokens.
    return LevelResult(8, None, 8, {
        "plain-dp": target_level(100, 100 / 100.0, 0.008),
        "eagle-dp": target_level(100, 100 / 60.0, 0.005),  # fastest TPOT, but carries 60% of the load
        "adaptive-dp": target_level(100, 100 / adaptive_tok_s, 0.007),
        "specgate": target_level(100, 100 / 98.0, 0.0072),
    })


def test_tpot_is_judged_only_against_baselines_that_carry_the_load() -> None:
    best = best_baselines(level(92.0), FAIR)
    assert (best.throughput, best.tpot) == ("plain-dp", "adaptive-dp")  # 92 >= 0.9 x 100 carries; eagle 60 does not
    best = best_baselines(level(89.0), FAIR)
    assert (best.throughput, best.tpot) == ("plain-dp", "plain-dp")  # 89 < 90: only the best itself carries it


def test_the_single_comparison_keeps_its_rule_every_baseline_on_tpot() -> None:
    single = Comparison("specgate", ("plain-dp", "eagle-dp", "adaptive-dp"))
    assert best_baselines(level(92.0), single).tpot == "eagle-dp"
    assert LEGACY_COMPARISON.carrying_within is None and LEGACY_COMPARISON.kind == "single"


def test_ratios_record_the_best_baselines_and_survive_results_json() -> None:
    doc = build_document("envelope", [level(92.0)], TARGETS, SETTINGS, "python -m loadtest envelope")
    doc = add_ratios(doc, FAIR, [Bound("throughput_ratio", ">=", 0.97), Bound("tpot_ratio", "<=", 1.03)])
    (lv,) = doc.levels
    assert lv.ratios["throughput_ratio"] == pytest.approx(0.98)
    assert lv.ratios["tpot_ratio"] == pytest.approx(0.0072 / 0.007)
    # TTFTs tie (plain-dp, the first, is named); E2E follows TPOT here.
    best = {"throughput": "plain-dp", "tpot": "adaptive-dp", "ttft": "plain-dp", "e2e_p50": "adaptive-dp", "e2e_p99": "adaptive-dp"}
    assert lv.best == best
    assert lv.ratios["ttft_p50_ratio"] == pytest.approx(1.0) and lv.ratios["failed_requests"] == 0
    assert doc.envelope is not None and doc.envelope.all_met
    raw = doc.to_json()
    assert raw["levels"][0]["best"] == best
    assert raw["envelope"]["comparison"] == "same-hardware" and raw["envelope"]["carrying_within"] == 0.1
    again = ResultsDocument.from_json(raw)
    assert again.envelope is not None and again.envelope.comparison == FAIR
    assert again.levels[0].best == lv.best and "best" not in again.levels[0].ratios
    section = "\n".join(envelope_markdown(again))
    assert "carry the load" in section and "| 8 | plain-dp 100.0 | 0.980 | adaptive-dp 7.00 |" in section


def test_one_sweep_per_target_merges_into_one_level_with_every_target() -> None:
    full = level(92.0)
    per_target = [[LevelResult(8, None, 8, {name: result})] for name, result in full.targets.items()]
    (merged,) = merge_levels(per_target)
    assert list(merged.targets) == list(full.targets) and merged.requests == 8


def test_specgate_runs_colocated_for_one_group_and_groups_above() -> None:
    stack = StackSettings("llama8b-h100", None, "groups", "adaptive", time_scale=2.0)
    one = specgate_config(stack, Hardware(1, 8), 9000)["launch"]
    assert one["topology"] == "colocated" and one["eagle"]["gpus"] == one["plain"]["gpus"] == list(range(8))
    eight = specgate_config(stack, Hardware(8, 1), 9000)["launch"]
    assert eight["topology"] == "groups" and eight["groups"] == [[i] for i in range(8)]
    assert Hardware(2, 4).gpu_sets() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_eagle_dp_gets_specgates_eagle_cap_and_a_group_that_does_not_fit_is_refused() -> None:
    stack = StackSettings("field-8gpu", None, "groups", "adaptive")
    assert eagle_dp_cap(specgate_config(stack, Hardware(1, 8), 9000)) == 128  # the adaptive policy's default cap
    capped = StackSettings("field-8gpu", None, "groups", "adaptive", eagle_max_running_requests=64)
    assert eagle_dp_cap(specgate_config(capped, Hardware(1, 8), 9000)) == 64
    with pytest.raises(PlanError, match="cannot hold both servers"):
        eagle_dp_cap(specgate_config(stack, Hardware(4, 2), 9000))  # two 238 GB copies > 0.8 of 2 x 180 GB
    assert eagle_dp_cap(specgate_config(stack, Hardware(2, 4), 9000)) == 128  # the memory split holds them
    wider = specgate_config(stack, Hardware(2, 4, eagle_mem_fraction=0.4), 9000)
    assert wider["launch"]["eagle"]["mem_fraction_static"] == 0.4 and eagle_dp_cap(wider) == 128
