"""A whole envelope in virtual time: deterministic, every target on the same plans, and the CLI that writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from loadtest.envelope.fair import Hardware
from loadtest.results import ResultsDocument
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings
from vnode.cli import main
from vnode.envelope import EnvelopeSpec, run_envelope


def spec(seed: int) -> EnvelopeSpec:
    levels = tuple(Level(concurrency=c) for c in (1, 4, 16))
    settings = SweepSettings(levels=levels, requests_per_level=RequestsPerLevel(2, True, 6), input_len=64, output_len=24,
                             seed=seed)
    return EnvelopeSpec(Hardware(2, 1), settings, profile="llama8b-h100")


def numbers(doc: ResultsDocument) -> list[Any]:
    return [level.to_json() for level in doc.levels]


def test_the_same_seed_gives_the_same_results_and_another_seed_others() -> None:
    first, again, other = run_envelope(spec(0)), run_envelope(spec(0)), run_envelope(spec(1))
    assert numbers(first) == numbers(again)
    assert numbers(first) != numbers(other)
    for level in first.levels:
        assert list(level.targets) == ["plain-dp", "eagle-dp", "adaptive-dp", "specgate"]
        assert {t.stats.completed for t in level.targets.values()} == {level.requests}
        assert level.ratios["failed_requests"] == 0 and level.ratios["throughput_ratio"] is not None


def test_the_cli_prints_the_envelope_and_writes_results_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "envelope", "--profile", "field-8gpu", "--concurrency", "1,2", "--requests-per-level", "4",
        "--min-requests-per-level", "4", "--output-len", "16", "--out", str(out),
    ])
    assert result.exit_code in (0, 1), result.output  # 1: a bound not met, which is the policy's business
    doc = ResultsDocument.load(out / "results.json")
    assert doc.command.startswith("python -m vnode envelope --profile field-8gpu")
    assert [lv.label for lv in doc.levels] == ["C=1", "C=2"] and doc.envelope is not None
    assert all(t.stats.completed == 4 for lv in doc.levels for t in lv.targets.values())
    assert "specgate" in result.output and (out / "report.md").exists()
