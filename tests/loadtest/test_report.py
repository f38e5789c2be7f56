"""Results files, envelope ratios and bound checks, from synthetic level results."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadtest.cli import main
from loadtest.envelope.comparison import Bound, add_ratios, envelope_markdown
from loadtest.records import LevelRun, RequestRecord
from loadtest.report import build_document, markdown, write_all
from loadtest.results import LevelResult, Monitor, ResultsDocument, TargetResult
from loadtest.stats import Slo, level_stats
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings, Target
from loadtest.verdicts import Comparison
from loadtest.workloads.multi_turn import MultiTurn
from loadtest.workloads.tiers import TierMix

MONITOR = Monitor(
    loop_lag={"p50_ms": 0.1, "p99_ms": 0.5, "max_ms": 1.0},
    cpu={"loadgen_cpu_pct": 20.0, "machine_busy_pct": 50.0, "cores": 2.0},
    sim_slip={"http://127.0.0.1:1": {"slip_ms": 30.0, "steps": 100.0, "mean_step_lateness_ms": 0.3}, "http://127.0.0.1:2": None},
)
COMPARISON = Comparison("specgate", ("eagle", "plain"))


def run_of(tokens: int, seconds: float, gap: float, backend: str | None = None) -> LevelRun:
    """One request of `tokens` tokens, one per chunk `gap` apart, inside a `seconds` window."""
    chunks = [0.01 + gap * i for i in range(tokens)]
    record = RequestRecord(
        start=0.0, expected_output=tokens, end=chunks[-1], status=200, chunk_times=chunks,
        chunk_texts=["w"] * tokens, prompt_tokens=8, completion_tokens=tokens, backend=backend,
    )
    return LevelRun(0.0, seconds, [record])


def target_level(tokens: int, seconds: float, gap: float, backend: str | None = None) -> TargetResult:
    return TargetResult(level_stats(run_of(tokens, seconds, gap, backend)), MONITOR)


def envelope_results() -> list[LevelResult]:
    # C=1: eagle 100 tok/s, plain 50, specgate 98 (on eagle); C=2: plain wins, specgate 90% of it.
    return [
        LevelResult(1, None, 1, {
            "eagle": target_level(100, 1.0, 0.005),
            "plain": target_level(50, 1.0, 0.010),
            "specgate": target_level(98, 1.0, 0.0052, backend="eagle"),
        }),
        LevelResult(2, None, 2, {
            "eagle": target_level(60, 1.0, 0.012),
            "plain": target_level(100, 1.0, 0.008),
            "specgate": target_level(90, 1.0, 0.0084, backend="plain"),
        }),
    ]


SETTINGS = SweepSettings(levels=(Level(concurrency=1), Level(concurrency=2)), requests_per_level=RequestsPerLevel(1, True),
                         input_len=8, output_len=100)
TARGETS = [Target("eagle", "http://e"), Target("plain", "http://p"), Target("specgate", "http://s")]


def test_envelope_ratios_and_bounds() -> None:
    doc = build_document("envelope", envelope_results(), TARGETS, SETTINGS, "python -m loadtest envelope")
    doc = add_ratios(doc, COMPARISON, [Bound("throughput_ratio", ">=", 0.95), Bound("tpot_ratio", "<=", 1.05)])
    first, second = doc.levels
    assert first.ratios["throughput_ratio"] == pytest.approx(0.98)
    assert second.ratios["throughput_ratio"] == pytest.approx(0.90)
    assert first.ratios["tpot_ratio"] == pytest.approx(0.0052 / 0.005)
    assert second.ratios["tpot_ratio"] == pytest.approx(0.0084 / 0.008)
    assert doc.envelope is not None and not doc.envelope.all_met
    tput, tpot = doc.envelope.checks
    assert (tput.met, tput.worst_at) == (False, 2) and tput.worst == pytest.approx(0.90)
    assert tpot.met and tpot.worst == pytest.approx(1.05)
    assert first.targets["specgate"].stats.backend_share == {"eagle": 1.0}


def test_the_comparison_comes_from_the_data_not_from_fixed_names() -> None:
    renamed = [
        LevelResult(lv.concurrency, None, lv.requests, {
            "eagle-dp": lv.targets["eagle"], "plain-dp": lv.targets["plain"], "gw": lv.targets["specgate"],
        })
        for lv in envelope_results()
    ]
    targets = [Target("eagle-dp", "http://e"), Target("plain-dp", "http://p"), Target("gw", "http://s")]
    doc = build_document("envelope", renamed, targets, SETTINGS, "x")
    doc = add_ratios(doc, Comparison("gw", ("eagle-dp", "plain-dp")), [Bound("throughput_ratio", ">=", 0.8)])
    assert [lv.ratios["throughput_ratio"] for lv in doc.levels] == pytest.approx([0.98, 0.90])
    section = "\n".join(envelope_markdown(doc))
    assert "gw output tok/s / max(eagle-dp, plain-dp)" in section and "| 2 | plain-dp 100.0 |" in section


def test_all_files_are_written_and_agree(tmp_path: Path) -> None:
    doc = build_document("envelope", envelope_results(), TARGETS, SETTINGS, "python -m loadtest envelope")
    doc = add_ratios(doc, COMPARISON, [Bound("throughput_ratio", ">=", 0.8)])
    write_all(doc, tmp_path, envelope_markdown(doc))
    for name in ("results.json", "results.csv", "throughput.png", "latency.png", "report.md"):
        assert (tmp_path / name).stat().st_size > 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["levels"][1]["targets"]["plain"]["output_tok_s"] == pytest.approx(100.0)
    assert saved["health"]["ok"] and saved["health"]["worst_sim_step_lateness_ms"] == pytest.approx(0.3)
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 6 and {r["target"] for r in rows} == {"eagle", "plain", "specgate"}
    assert float(rows[0]["throughput_ratio"]) == pytest.approx(0.98)
    report = (tmp_path / "report.md").read_text()
    assert "![output throughput](throughput.png)" in report and "![TPOT and TTFT p50](latency.png)" in report
    assert "throughput_ratio >= 0.8: met" in report
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert ResultsDocument.load(tmp_path / "results.json").to_json() == doc.to_json()


def test_health_flags_a_lagging_load_generator() -> None:
    lagging = replace(MONITOR, loop_lag={"p50_ms": 3.0, "p99_ms": 40.0, "max_ms": 90.0})
    results = [LevelResult(1, None, 1, {"a": TargetResult(level_stats(run_of(10, 1.0, 0.01)), lagging)})]
    doc = build_document("sweep", results, [Target("a", "http://a")], SETTINGS, "x")
    assert not doc.health.ok
    assert doc.health.flagged == ("a C=1: loop lag p99 40.0 ms",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "--target", "nourl", "--out", "x"], "NAME=URL"),
        (["sweep", "--target", "a=http://x", "--target", "a=http://y", "--out", "x"], "unique"),
        (["sweep", "--target", "a=http://x", "--concurrency", "1,0", "--out", "x"], "at least 1"),
        (["sweep", "--target", "a=http://x", "--concurrency", "1", "--request-rate", "2", "--out", "x"], "not both"),
        (["sweep", "--target", "a=http://x", "--request-rate", "2", "--requests-per-level", "2x", "--out", "x"], "absolute"),
        (["sweep", "--target", "a=http://x", "--requests-per-level", "many", "--out", "x"], "positive integer"),
        (["envelope", "--out", "x"], "exactly one of --profile"),
        (["envelope", "--profile", "nope", "--out", "x"], "unknown profile"),
        (["envelope", "--profile", "field-8gpu", "--time-scale", "-1", "--out", "x"], "positive"),
        (["envelope", "--profile", "field-8gpu", "--policy-param", "oops", "--out", "x"], "KEY=VALUE"),
        (["sweep", "--target", "a=http://x", "--dataset", "chat-logs", "--out", "x"], "'chat-logs' is not one of"),
        (["sweep", "--target", "a=http://x", "--burstiness", "0", "--out", "x"], "--burstiness"),
        (["envelope", "--profile", "field-8gpu", "--request-rate", "1", "--burstiness", "-1", "--out", "x"], "--burstiness"),
        (["sweep", "--target", "a=http://x", "--request-rate", "0", "--out", "x"], "positive"),
        (["sweep", "--target", "a=http://x", "--dataset", "trace", "--out", "x"], "needs --trace FILE"),
        (["sweep", "--target", "a=http://x", "--trace", "/no/such/trace.jsonl", "--dataset", "trace", "--out", "x"],
         "does not exist"),
        (["sweep", "--target", "a=http://x", "--dataset", "shared-prefix", "--requests-per-level", "8", "--out", "x"],
         "does not apply to --dataset shared-prefix"),
        (["sweep", "--target", "a=http://x", "--tier-mix", "gold=0.5", "--out", "x"], "service tier must be one of"),
        (["sweep", "--target", "a=http://x", "--tier-mix", "flex=0.7,priority=0.7", "--out", "x"], "more than 1"),
        (["sweep", "--target", "a=http://x", "--no-stream", "--slo-tpot-ms", "20", "--out", "x"], "streamed"),
        (["sweep", "--target", "a=http://x", "--length-dist", "lognormal", "--range-ratio", "0.5", "--out", "x"],
         "range ratio below 1"),
        (["sweep", "--target", "a=http://x", "--length-median-ratio", "0", "--out", "x"], "--length-median-ratio"),
    ],
)
def test_bad_command_lines_get_a_clear_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_sweep_against_nothing_fails_cleanly(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["sweep", "--target", "a=http://127.0.0.1:9", "--concurrency", "1", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:9/v1/models" in result.output


def test_a_bad_trace_is_a_click_error_naming_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n{"timestamp": 5}\n')
    args = ["sweep", "--target", "a=http://x", "--dataset", "trace", "--trace", str(trace), "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--trace" in result.output
    assert "line 2: missing input_length, output_length, hash_ids" in result.output
    for extra, message in ((["--concurrency", "4"], "own schedule"), (["--burstiness", "0.5"], "keeps its own")):
        trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
        result = CliRunner().invoke(main, [*args, *extra])
        assert result.exit_code == 2 and message in result.output


def traffic_run(cached: int, tiers: tuple[str | None, ...]) -> LevelRun:
    """One request per tier, 10 tokens 10 ms apart after a 100 ms TTFT, `cached` of its 100 prompt tokens cached."""
    records = []
    for tier in tiers:
        chunks = [0.1 + 0.01 * i for i in range(10)]
        records.append(RequestRecord(
            start=0.0, expected_output=10, end=chunks[-1], status=200, chunk_times=chunks, chunk_texts=["w"] * 10,
            prompt_tokens=100, completion_tokens=10, cached_tokens=cached, tier=tier,
        ))
    return LevelRun(0.0, 1.0, records)


def test_cache_hits_goodput_and_tiers_reach_results_json_csv_and_the_report(tmp_path: Path) -> None:
    settings = replace(SETTINGS, levels=(Level(request_rate=2.0),), dataset=MultiTurn(turns=3), slo=Slo(ttft_ms=150.0),
                       tier_mix=TierMix.parse("priority=0.5"))
    stats = level_stats(traffic_run(25, ("priority", None)), slo=settings.slo)
    level = LevelResult(None, 2.0, 2, {"a": TargetResult(stats, MONITOR)}, offered_request_s=2.0)
    doc = build_document("sweep", [level], [Target("a", "http://a")], settings, "x")
    write_all(doc, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    lv, target = saved["levels"][0], saved["levels"][0]["targets"]["a"]
    assert lv["offered_request_s"] == 2.0 and "trace_time_scale" not in lv
    assert (target["total_cached_tokens"], target["cache_hit_rate"], target["goodput_request_s"]) == (50, 0.25, 2.0)
    assert set(target["tiers"]) == {"priority", "none"} and target["tiers"]["priority"]["requests"] == 1
    assert saved["settings"]["dataset"] == {"name": "multi-turn", "turns": 3, "think_time_s": 1.0, "tenants": 4,
                                            "system_prompt_len": 1024}
    assert (saved["settings"]["tier_mix"], saved["settings"]["slo_ttft_ms"]) == ("priority=0.5", 150.0)
    assert ResultsDocument.load(tmp_path / "results.json").to_json() == doc.to_json()  # the new keys round-trip
    (row,) = csv.DictReader((tmp_path / "results.csv").open())
    assert row["cache_hit_rate"] == "0.25" and row["tier_priority_goodput_request_s"] == "1.0" and row["offered_request_s"] == "2.0"
    report = (tmp_path / "report.md").read_text()
    assert "dataset `multi-turn` (turns 3, think_time_s 1.0, tenants 4, system_prompt_len 1024)" in report
    assert "Poisson arrivals; service tiers priority=0.5; goodput SLOs TTFT <= 150 ms" in report
    assert "| 2/s | a | 2.00 | 2.00 | 2.00 | 25.0% |" in report
    assert "| 2/s | a | priority | 1 | 1 | 1.00 |" in report


def test_the_envelope_checks_latency_ratios_and_failures_at_open_loop_levels() -> None:
    levels = [replace(lv, concurrency=None, request_rate=rate, offered_request_s=rate)
              for lv, rate in zip(envelope_results(), (4.0, 8.0), strict=True)]
    failing = replace(levels[1].targets["plain"].stats, failed=2)
    levels[1] = replace(levels[1], targets={**levels[1].targets, "plain": TargetResult(failing, MONITOR)})
    settings = replace(SETTINGS, levels=(Level(request_rate=4.0), Level(request_rate=8.0)))
    doc = build_document("envelope", levels, TARGETS, settings, "x")
    bounds = [Bound("ttft_p50_ratio", "<=", 1.0), Bound("e2e_p99_ratio", "<=", 1.06), Bound("failed_requests", "<=", 0.0)]
    doc = add_ratios(doc, COMPARISON, bounds)
    assert [lv.ratios["failed_requests"] for lv in doc.levels] == [0, 2]
    # E2E = 10 ms + the gaps: specgate 98 tokens 5.2 ms apart against plain's 50 at 10 ms, then 90 at 8.4 against eagle's 60 at 12.
    assert doc.levels[0].ratios["e2e_p50_ratio"] == pytest.approx((0.01 + 0.0052 * 97) / (0.01 + 0.01 * 49))
    assert doc.levels[1].ratios["e2e_p99_ratio"] == pytest.approx((0.01 + 0.0084 * 89) / (0.01 + 0.012 * 59))
    assert doc.levels[1].best is not None and doc.levels[1].best["e2e_p99"] == "eagle"
    assert doc.envelope is not None
    ttft, e2e, failed = doc.envelope.checks
    assert ttft.met and e2e.met and (e2e.worst_at, failed.met, failed.worst_at) == (8.0, False, 8.0)
    section = "\n".join(envelope_markdown(doc))
    assert "| level | better throughput |" in section and "| TTFT p50 ratio | E2E p50 ratio | E2E p99 ratio | failed requests |" in section
    assert "| 8/s | plain 100.0 |" in section and "failed_requests <= 0.0: NOT met (worst 2 at 8/s)" in section


def test_a_file_with_an_infinite_rate_renders_again(tmp_path: Path) -> None:
    stats = level_stats(traffic_run(0, (None,)))
    level = LevelResult(None, math.inf, 1, {"a": TargetResult(stats, MONITOR)}, offered_request_s=math.inf)
    doc = build_document("sweep", [level], [Target("a", "http://a")], replace(SETTINGS, levels=(Level(request_rate=math.inf),)), "x")
    write_all(doc, tmp_path)
    again = ResultsDocument.load(tmp_path / "results.json")
    assert again.levels[0].request_rate is None and "| inf/s | a |" in markdown(again)
