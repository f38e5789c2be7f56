"""The results file's typed shape: committed results.json files load and write back the same keys and values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.envelope.comparison import envelope_markdown
from loadtest.report import markdown, write_csv
from loadtest.results import ResultsDocument

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p for p in (ROOT / "docs" / "benchmarks").glob("envelope-*/results.json"))


def _key_paths(value: Any, prefix: str = "") -> list[str]:
    """Every key of a JSON value, nested ones as `a.b`, in file order (list items by index)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in [f"{prefix}{k}", *_key_paths(v, f"{prefix}{k}.")]]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _key_paths(v, f"{prefix}{i}.")]
    return []


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_a_committed_results_file_round_trips_exactly(path: Path) -> None:
    raw = json.loads(path.read_text())
    doc = ResultsDocument.from_json(raw)
    written = json.loads(doc.dumps())
    assert written == raw
    assert _key_paths(written) == _key_paths(raw)  # same keys in the same order
    assert doc.envelope is not None and len(doc.envelope.checks) == len(raw["envelope"]["checks"])
    assert list(doc.targets) == list(raw["targets"])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_a_committed_report_renders_again_from_its_results_file(path: Path, tmp_path: Path) -> None:
    doc = ResultsDocument.load(path)
    assert markdown(doc, envelope_markdown(doc)) == (path.parent / "report.md").read_text()
    write_csv(doc, tmp_path / "results.csv")
    assert (tmp_path / "results.csv").read_text() == (path.parent / "results.csv").read_text()


def test_there_are_committed_files_to_check() -> None:
    assert len(COMMITTED) >= 7


def test_a_target_series_follows_one_target_across_levels() -> None:
    doc = ResultsDocument.load(ROOT / "docs/benchmarks/envelope-field-8gpu-colocated-adaptive/results.json")
    series = doc.series("adaptive")
    xs, ys = series.values(lambda t: t.stats.output_tok_s)
    assert xs == [lv["concurrency"] for lv in json.loads(doc.dumps())["levels"]]
    assert ys == [lv.targets["adaptive"].stats.output_tok_s for lv in doc.levels]


def test_the_generic_sweep_imports_nothing_of_the_simulator_or_the_gateway() -> None:
    code = (
        "import sys; from loadtest.cli import main; import loadtest.sweep_cli, loadtest.report, loadtest.table; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('backends', 'gateway') or m.startswith('loadtest.envelope')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
