"""The same-hardware envelope with its baselines behind SMG's cache_aware router, end to end.

A tiny shared-prefix envelope on K=2 (its default routers: each baseline behind the least-in-flight
balancer and behind SMG). The default suite runs it with a stand-in `smg` (`smg_standin.py`, which
keeps each first message on one worker); the `smg` marker with the real SMG (SPECGATE_SMG). Both
check that every target got the same requests, that SMG's targets kept each prefix group on one
worker (at C=1 every request after its group's first found the whole system prompt cached), that
specgate was judged against all six baselines, and that the report names SMG's version and policy.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from loadtest.cli import main
from tests.cluster.smg_stack import smg_executable
from tests.loadtest.smg_standin import POLICY_SETTINGS, VERSION

GROUPS, PER_GROUP, SYSTEM = 4, 4, 256
BASELINES = ["plain-dp", "plain-dp+smg", "eagle-dp", "eagle-dp+smg", "adaptive-dp", "adaptive-dp+smg"]


def shared_prefix_envelope(out: Path, smg: str) -> dict[str, Any]:
    """Run the tiny envelope (C=1, then C=4) with `smg` as the SMG executable; its results.json."""
    result = CliRunner().invoke(main, [
        "envelope", "--profile", "llama8b-h100", "--groups", "2", "--gpus-per-group", "1", "--dataset", "shared-prefix",
        "--gsp-num-groups", str(GROUPS), "--gsp-prompts-per-group", str(PER_GROUP),
        "--gsp-system-prompt-len", str(SYSTEM), "--gsp-question-len", "16", "--gsp-output-len", "8",
        "--concurrency", "1,4", "--time-scale", "1", "--warmup", "1", "--min-throughput-ratio", "0.01",
        "--max-tpot-ratio", "100", "--smg", smg, "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text())


def check_the_smg_envelope(doc: dict[str, Any], out: Path) -> None:
    """What both runs must show (see the module's docstring)."""
    assert list(doc["targets"]) == [*BASELINES, "specgate"]
    assert doc["envelope"]["baselines"] == BASELINES and doc["stack"]["baseline_routers"] == ["least-inflight", "smg"]
    for level in doc["levels"]:
        sent = {(t["completed"], t["total_input_tokens"], t["total_output_tokens"]) for t in level["targets"].values()}
        assert len(sent) == 1 and next(iter(sent))[0] == GROUPS * PER_GROUP, f"not the same requests everywhere: {sent}"
        assert level["best"]["throughput"] in BASELINES and level["throughput_ratio"] > 0
    sequential = doc["levels"][0]["targets"]
    for mode in ("plain-dp", "eagle-dp", "adaptive-dp"):
        # One miss per group, then hits on the whole system prompt: every group stayed on one worker.
        assert sequential[f"{mode}+smg"]["total_cached_tokens"] >= GROUPS * (PER_GROUP - 1) * SYSTEM
        assert sequential[f"{mode}+smg"]["cache_hit_rate"] > sequential[mode]["cache_hit_rate"]
    assert "--policy cache_aware" in doc["stack"]["servers"]["plain-dp+smg"][1]
    report = (out / "report.md").read_text()
    smg = doc["stack"]["smg"]
    assert f"SMG {smg['version']} (`smg launch --policy cache_aware`)" in report
    assert smg["policy_settings"] is not None and smg["policy_settings"] in report
    assert "| C=1 | adaptive-dp+smg |" in report.split("## Traffic")[1]  # its cache hit, goodput and latencies
    # Nothing the run started still listens: no simulator, balancer, SMG (its metrics port too) or gateway.
    used = {int(p) for argv in doc["stack"]["servers"].values() for p in re.findall(r"-port (\d+)", " ".join(argv))}
    used |= {int(url.rsplit(":", 1)[1]) for url in doc["targets"].values()}
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert used & listening == set()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_baselines_behind_a_stand_in_smg(tmp_path: Path) -> None:
    standin = tmp_path / "smg"
    standin.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("smg_standin.py")}" "$@"\n')
    standin.chmod(0o755)
    doc = shared_prefix_envelope(tmp_path / "out", str(standin))
    check_the_smg_envelope(doc, tmp_path / "out")
    assert doc["stack"]["smg"]["version"] == VERSION and doc["stack"]["smg"]["policy_settings"] == POLICY_SETTINGS


@pytest.mark.smg
@pytest.mark.timeout(420)
def test_the_baselines_behind_the_real_smg(tmp_path: Path) -> None:
    executable = smg_executable()
    if executable is None:
        pytest.skip("no smg: install the pinned `smg` into a venv and point SPECGATE_SMG at its smg (.ci/run does)")
    doc = shared_prefix_envelope(tmp_path / "out", executable)
    check_the_smg_envelope(doc, tmp_path / "out")
    assert doc["stack"]["smg"]["policy_settings"].startswith("CacheAware { cache_threshold: ")
