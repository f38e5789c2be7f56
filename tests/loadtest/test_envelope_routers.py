"""The routers in front of the same-hardware baselines: names, defaults, SMG's command line, and the CLI's checks.

Nothing here starts a server: the CLI's refusals come before anything runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from loadtest.cli import main
from loadtest.envelope.baselines import baselines, default_router_choice
from loadtest.envelope.fair import FairEnvelope, Hardware
from loadtest.envelope.harness import StackSettings
from loadtest.envelope.smg import Smg, policy_settings
from loadtest.progress import PlainProgress
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings
from tests.loadtest.smg_standin import VERSION

STACK = StackSettings(profile="llama8b-h100", profile_file=None, topology="groups", policy="adaptive")
SETTINGS = SweepSettings(levels=(Level(concurrency=1),), requests_per_level=RequestsPerLevel(4), input_len=8, output_len=8)
SMG = Smg("/opt/smg/bin/smg", "1.13.0")
PROGRESS = PlainProgress(Console())


@pytest.fixture
def standin(tmp_path: Path) -> str:
    """An executable `smg` (the stand-in)."""
    path = tmp_path / "smg"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("smg_standin.py")}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_each_mode_runs_behind_each_router_and_smgs_targets_say_so() -> None:
    names = [b.name for b in baselines(("least-inflight", "smg"))]
    assert names == ["plain-dp", "plain-dp+smg", "eagle-dp", "eagle-dp+smg", "adaptive-dp", "adaptive-dp+smg"]
    assert [(b.role, b.router) for b in baselines(("smg",))] == [("plain", "smg"), ("eagle", "smg"), ("adaptive", "smg")]


@pytest.mark.parametrize(("dataset", "groups", "choice"), [
    ("shared-prefix", 2, "both"), ("multi-turn", 8, "both"), ("trace", 2, "both"),
    ("random", 2, "least-inflight"), ("shared-prefix", 1, "least-inflight"),
])
def test_smg_joins_by_default_where_prefixes_are_shared_and_there_is_a_choice(dataset: str, groups: int, choice: str) -> None:
    assert default_router_choice(dataset, groups) == choice


def test_smg_is_launched_with_cache_aware_at_its_defaults_health_on_health_and_metrics_on_loopback() -> None:
    argv = SMG.argv("127.0.0.1", 4000, 4001, ["http://127.0.0.1:5000", "http://127.0.0.1:5001"])
    assert argv == (
        "/opt/smg/bin/smg", "launch", "--host", "127.0.0.1", "--port", "4000",
        "--worker-urls", "http://127.0.0.1:5000", "http://127.0.0.1:5001", "--policy", "cache_aware",
        "--health-check-endpoint", "/health", "--prometheus-host", "127.0.0.1", "--prometheus-port", "4001",
    )  # fmt: skip


def test_the_policy_settings_are_read_from_smgs_coloured_startup_line() -> None:
    line = (
        "\x1b[2m2026-12-02 09:59:02\x1b[0m \x1b[32m INFO\x1b[0m smg::server: Starting router on 127.0.0.1:31010 | mode: "
        'Regular { worker_urls: ["http://127.0.0.1:31001"] } | policy: CacheAware { cache_threshold: 0.3, '
        "cache_boundaries: [], selection_policy: None } | max_payload: 512MB\n"
    )
    assert policy_settings("banner\n" + line) == "CacheAware { cache_threshold: 0.3, cache_boundaries: [], selection_policy: None }"
    assert policy_settings("no such line") is None


def test_the_version_comes_from_smg_itself_and_anything_else_is_refused(standin: str, tmp_path: Path) -> None:
    assert Smg.probe(standin) == Smg(standin, VERSION)
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\necho hello\n")
    other.chmod(0o755)
    with pytest.raises(RuntimeError, match="did not answer `smg VERSION`"):
        Smg.probe(str(other))


def test_specgate_is_judged_against_every_baseline_of_both_routers_and_the_report_names_smg(tmp_path: Path) -> None:
    both = FairEnvelope(STACK, Hardware(2, 1), SETTINGS, tmp_path, PROGRESS, ("least-inflight", "smg"), SMG)
    names = [t.name for t in both.targets()]
    assert names == [b.name for b in baselines(("least-inflight", "smg"))] + ["specgate"]
    assert both.comparison().baselines == tuple(names[:-1])
    assert "--role plain" in " ".join(both.sim_argv("plain-dp+smg")) and "--enable-cache-report" in both.sim_argv("eagle-dp+smg")
    both.smg_policy = "CacheAware { cache_threshold: 0.3 }"
    text = both.describe()
    assert "once behind a least-in-flight balancer and once behind the SMG router (`+smg`)" in text
    assert "SMG 1.13.0 (`smg launch --policy cache_aware`)" in text and "`CacheAware { cache_threshold: 0.3 }`" in text
    plain = FairEnvelope(STACK, Hardware(2, 1), SETTINGS, tmp_path, PROGRESS)
    assert "SMG" not in plain.describe() and [t.name for t in plain.targets()][:1] == ["plain-dp"]
    with pytest.raises(ValueError, match="K > 1"):
        FairEnvelope(STACK, Hardware(1, 1), SETTINGS, tmp_path, PROGRESS, ("smg",), SMG)


def envelope_cli(tmp_path: Path, *args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["envelope", "--profile", "llama8b-h100", "--gpus-per-group", "1",
                                       "--out", str(tmp_path / "out"), *args], env=env)
    assert not (tmp_path / "out").exists(), "refused before anything started"
    return result.exit_code, result.output


def test_a_router_needs_replicas_and_the_same_hardware_comparison(tmp_path: Path) -> None:
    code, output = envelope_cli(tmp_path, "--groups", "1", "--baseline-router", "smg-cache-aware")
    assert code == 2 and "with --groups 1 each baseline is one server" in output
    code, output = envelope_cli(tmp_path, "--compare", "single", "--baseline-router", "both")
    assert code == 2 and "--baseline-router applies to the same-hardware comparison" in output


def test_a_shared_prefix_run_without_smg_says_how_to_get_it(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    code, output = envelope_cli(tmp_path, "--groups", "2", "--dataset", "shared-prefix",
                                env={"SPECGATE_SMG": None, "PATH": str(empty)})
    assert code == 2
    assert "--baseline-router both (the default for --dataset shared-prefix) runs the SMG router" in output
    assert "--smg PATH or SPECGATE_SMG" in output


def test_an_smg_that_is_not_smg_is_refused(tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    impostor.write_text("#!/bin/sh\nexit 3\n")
    impostor.chmod(0o755)
    code, output = envelope_cli(tmp_path, "--groups", "2", "--baseline-router", "both", "--smg", str(impostor))
    assert code == 2 and "Invalid value for --smg" in output
