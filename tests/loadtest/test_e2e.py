"""End-to-end: short sweeps against a simulator and through `specgate serve`, and a short envelope."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from backends.process import Child
from backends.testbed import running_sim, start_gateway
from loadtest.cli import main

FAST = ["--warmup", "1", "--input-len", "32"]


def sweep(out: Path, *args: str) -> dict:
    result = CliRunner().invoke(main, ["sweep", *FAST, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text())


def _plain_sweep(out: Path) -> tuple[dict, str]:
    """A closed-loop sweep at concurrency 1 and 4 against one plain sim (field-8gpu, time scale 0.5):
    its results and the sim's URL. The model's TPOT at batch B is (4.53 + 1.294 B) * 0.5 ms."""
    with running_sim("--role", "plain", "--time-scale", "0.5", "--enable-metrics") as sim:
        doc = sweep(out, "--target", f"plain={sim.url()}", "--concurrency", "1,4",
                    "--requests-per-level", "2x", "--min-requests-per-level", "4", "--output-len", "24")
    return doc, sim.url()


def _model_tpot(batch: int) -> float:
    return (4.53 + 1.294 * batch) * 0.5


def test_sweep_against_a_simulator_reports_every_request_and_the_models_shape(tmp_path: Path) -> None:
    doc, url = _plain_sweep(tmp_path)
    one, four = doc["levels"]
    for level in (one, four):
        t = level["targets"]["plain"]
        assert t["completed"] == level["requests"] and t["failed"] == 0
        assert t["total_output_tokens"] == 24 * level["requests"]  # ignore_eos + max_tokens: exact
        assert t["total_input_tokens"] > 32 * level["requests"]  # 32 words + the chat template
        # A step is never early, so the model's step at batch 1 is a floor; a closed loop's batch dips below C
        # while replacements are prefilled, the more so on a loaded machine (how close it comes: the simtiming test).
        assert t["tpot_p50_ms"] >= 0.95 * _model_tpot(1)
        assert t["backend_share"] is None
        slip = t["monitor"]["sim_slip"][url]
        assert slip is not None and slip["steps"] > 0
    assert four["targets"]["plain"]["tpot_p50_ms"] > one["targets"]["plain"]["tpot_p50_ms"]  # batching costs per step
    assert four["targets"]["plain"]["output_tok_s"] > 1.2 * one["targets"]["plain"]["output_tok_s"]  # and pays overall
    assert doc["command"].startswith("python -m loadtest sweep")
    for name in ("results.csv", "throughput.png", "latency.png", "report.md"):
        assert (tmp_path / name).exists()


@pytest.mark.simtiming
def test_sweep_against_a_simulator_measures_what_the_model_predicts(tmp_path: Path) -> None:
    doc, _ = _plain_sweep(tmp_path)
    one, four = doc["levels"]
    for level, batch in ((one, 1), (four, 4)):
        t = level["targets"]["plain"]
        assert t["tpot_p50_ms"] == pytest.approx(_model_tpot(batch), rel=0.15)
        assert t["itl_p50_ms"] == pytest.approx(_model_tpot(batch), rel=0.25)
    assert four["targets"]["plain"]["output_tok_s"] > 2 * one["targets"]["plain"]["output_tok_s"]


def test_open_loop_sweep_and_completions_endpoint(tmp_path: Path) -> None:
    with running_sim("--role", "eagle", "--time-scale", "0.2") as sim:
        doc = sweep(tmp_path, "--target", f"eagle={sim.url()}", "--request-rate", "20,inf",
                    "--requests-per-level", "6", "--output-len", "12", "--endpoint", "completions")
    assert doc["mode"] == "open-loop"
    assert [lv["request_rate"] for lv in doc["levels"]] == [20.0, None]  # JSON has no infinity
    for level in doc["levels"]:
        t = level["targets"]["eagle"]
        assert t["completed"] == 6 and t["total_output_tokens"] == 72
        assert t["tpot_p50_ms"] is not None


def test_sweep_through_specgate_serve_embedded_default(tmp_path: Path) -> None:
    gw = start_gateway("--workers", "2")  # two on purpose: what the default gives a 2-core machine
    try:
        doc = sweep(tmp_path, "--target", f"specgate={gw.url}", "--concurrency", "1,8",
                    "--requests-per-level", "1x", "--min-requests-per-level", "8", "--output-len", "16")
    finally:
        assert gw.stop() == 0
    lone, busy = (lv["targets"]["specgate"] for lv in doc["levels"])
    assert lone["failed"] == busy["failed"] == 0
    # The share comes from each response's x-specgate-backend header. A request alone is
    # speculated; the default (adaptive) policy also sends one cold-start request to the idle
    # plain server, to measure it (one per worker: a worker probes before the other's probe has
    # come back). Where it sends the busy level's 8 while it is still learning is
    # not this test's business (tests/gateway/test_adaptive_e2e.py checks what it learns).
    assert lone["backend_share"]["eagle"] >= 0.75
    assert set(busy["backend_share"]) <= {"eagle", "plain"}
    assert sum(busy["backend_share"].values()) == pytest.approx(1.0)
    assert busy["total_output_tokens"] == 16 * 8


def test_non_streamed_sweep_reports_e2e_and_no_tpot(tmp_path: Path) -> None:
    with running_sim("--role", "plain", "--time-scale", "0.2") as sim:
        doc = sweep(tmp_path, "--target", f"plain={sim.url()}", "--concurrency", "2", "--no-stream",
                    "--requests-per-level", "2", "--min-requests-per-level", "0", "--output-len", "8")
    t = doc["levels"][0]["targets"]["plain"]
    assert t["completed"] == 2 and t["total_output_tokens"] == 16
    assert t["tpot_p50_ms"] is None and t["ttft_p50_ms"] == pytest.approx(t["e2e_p50_ms"])


def _processes_mentioning(ports: list[int]) -> list[psutil.Process]:
    needles = [str(p) for p in ports]
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        launched_by_us = "backends.sim" in cmd or "serve" in cmd
        if launched_by_us and any(f" {n}" in cmd or f"={n}" in cmd for n in needles):
            found.append(proc)
    return found


@pytest.mark.slow
def test_short_envelope_run_has_the_contract_shape_and_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "env"
    result = CliRunner().invoke(main, [
        "envelope", "--compare", "single", "--profile", "field-8gpu", "--policy", "threshold", "--concurrency", "1,4",
        "--time-scale", "0.5",
        "--requests-per-level", "1x", "--min-requests-per-level", "4", "--output-len", "24", "--input-len", "16",
        "--warmup", "1", "--min-throughput-ratio", "0.01", "--max-tpot-ratio", "100", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 4]
    for level in doc["levels"]:
        assert set(level["targets"]) == {"eagle", "plain", "specgate"}
        for t in level["targets"].values():
            assert t["failed"] == 0
            assert {"output_tok_s", "tpot_p50_ms", "ttft_p50_ms"} <= set(t)
        assert set(level["targets"]["specgate"]["backend_share"]) <= {"eagle", "plain"}
        assert level["throughput_ratio"] > 0 and level["tpot_ratio"] > 0
    assert doc["levels"][0]["targets"]["specgate"]["backend_share"] == {"eagle": 1.0}
    assert doc["envelope"]["all_met"]
    assert doc["stack"]["time_scale"] == 0.5 and doc["stack"]["policy"] == "threshold"
    assert "gateway_cpu_pct" in doc["levels"][1]["targets"]["specgate"]["monitor"]["cpu"]
    assert (out / "specgate.toml").exists() and (out / "report.md").read_text().count("## Envelope") == 1
    ports = [int(url.rsplit(":", 1)[1]) for url in doc["targets"].values()]
    assert _processes_mentioning(ports) == []


@pytest.mark.slow
def test_colocated_envelope_adds_the_adaptive_server_and_exits_nonzero_when_a_bound_fails(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "envelope", "--compare", "single", "--profile", "field-8gpu", "--topology", "colocated", "--concurrency", "1",
        "--time-scale", "0.3",
        "--requests-per-level", "2", "--min-requests-per-level", "0", "--output-len", "8", "--input-len", "8",
        "--warmup", "0", "--min-throughput-ratio", "50", "--out", str(tmp_path),
    ])
    assert result.exit_code == 1
    assert "throughput_ratio >= 50.0: NOT MET" in result.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["envelope"]["all_met"] is False
    assert set(doc["levels"][0]["targets"]) == {"eagle", "plain", "specgate", "adaptive"}
    assert doc["levels"][0]["targets"]["adaptive"]["completed"] == 2
    ports = [int(url.rsplit(":", 1)[1]) for url in doc["targets"].values()]
    assert _processes_mentioning(ports) == []


@pytest.mark.slow
def test_same_hardware_envelope_runs_four_targets_on_two_groups_and_leaves_nothing_running(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "envelope", "--profile", "llama8b-h100", "--groups", "2", "--gpus-per-group", "1", "--concurrency", "1,4",
        "--time-scale", "1", "--requests-per-level", "1x", "--min-requests-per-level", "4", "--output-len", "16",
        "--input-len", "16", "--warmup", "1", "--min-throughput-ratio", "0.01", "--max-tpot-ratio", "100",
        "--out", str(tmp_path),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "results.json").read_text())
    baselines = ["plain-dp", "eagle-dp", "adaptive-dp"]
    assert list(doc["targets"]) == [*baselines, "specgate"]
    assert doc["envelope"]["subject"] == "specgate" and doc["envelope"]["baselines"] == baselines
    assert doc["envelope"]["comparison"] == "same-hardware" and doc["envelope"]["all_met"]
    for level in doc["levels"]:
        assert level["throughput_ratio"] > 0 and level["tpot_ratio"] > 0
        assert level["best"]["throughput"] in baselines and level["best"]["tpot"] in baselines
        for name, t in level["targets"].items():
            assert t["failed"] == 0 and t["completed"] == level["requests"]
            slips = t["monitor"]["sim_slip"]
            assert len(slips) == (4 if name == "specgate" else 2)  # every replica's (every backend's) step lateness
            assert sum(s["steps"] for s in slips.values() if s) > 0
            assert ("balancer_cpu_pct" in t["monitor"]["cpu"]) == (name != "specgate")
        assert set(level["targets"]["specgate"]["backend_share"]) <= {"g0-eagle", "g0-plain", "g1-eagle", "g1-plain"}
    stack = doc["stack"]
    assert (stack["compare"], stack["groups"], stack["gpus_per_group"], stack["topology"]) == ("same-hardware", 2, 1, "groups")
    assert stack["eagle_dp_max_running_requests"] == 128  # the adaptive policy's cap, as specgate's EAGLE servers get
    assert "--max-running-requests 128" in stack["servers"]["eagle-dp"][0]
    assert doc["health"]["worst_balancer_cpu_pct"] is not None
    ports = [int(url.rsplit(":", 1)[1]) for url in doc["targets"].values()]
    assert _processes_mentioning(ports) == []


def test_same_hardware_envelope_refuses_groups_whose_weights_do_not_fit_before_starting_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "envelope", "--profile", "field-8gpu", "--groups", "4", "--gpus-per-group", "2", "--out", str(tmp_path),
    ])
    assert result.exit_code == 1
    assert "cannot hold both servers" in result.output and not (tmp_path / "logs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_envelope_interrupted_mid_sweep_stops_everything_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    argv = [sys.executable, "-m", "loadtest", "envelope", "--compare", "single", "--profile", "field-8gpu", "--concurrency", "2",
            "--requests-per-level", "10000", "--output-len", "64", "--input-len", "8", "--time-scale", "1",
            "--warmup", "0", "--out", str(tmp_path)]
    child = Child("loadtest", argv, log_path=tmp_path / "loadtest.log")
    child.start()
    assert child.proc is not None
    config = tmp_path / "specgate.toml"
    try:
        _wait_for_traffic(config, child.proc)
        child.proc.send_signal(sig)  # to the load generator alone, as a terminal or a job runner would
        assert child.wait_blocking(60) == 128 + int(sig)
        assert _processes_mentioning(_ports(config)) == []
    finally:
        child.stop_blocking(grace=30)  # SIGTERM first: it may still clean up as designed
        for leftover in _processes_mentioning(_ports(config)):
            leftover.kill()


@pytest.mark.slow
def test_same_hardware_envelope_interrupted_mid_sweep_stops_the_target_it_runs(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "loadtest", "envelope", "--profile", "llama8b-h100", "--groups", "2",
            "--gpus-per-group", "1", "--concurrency", "2", "--requests-per-level", "10000", "--output-len", "64",
            "--input-len", "8", "--time-scale", "1", "--warmup", "0", "--out", str(tmp_path)]
    child = Child("loadtest", argv, log_path=tmp_path / "loadtest.log")
    child.start()
    assert child.proc is not None
    started: list[psutil.Process] = []
    try:
        started = _wait_for_replica_traffic(child.proc)  # plain-dp's sim and its balancer
        child.proc.send_signal(signal.SIGTERM)
        assert child.wait_blocking(60) == 128 + int(signal.SIGTERM)
        assert [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        child.stop_blocking(grace=30)
        for leftover in started:
            if leftover.is_running():
                leftover.kill()


def _wait_for_replica_traffic(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The load test's children once its first simulator replica is decoding requests."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        children = psutil.Process(proc.pid).children(recursive=True)
        for sim in children:
            try:
                cmd = sim.cmdline()
            except psutil.Error:
                continue
            if "backends.sim" not in cmd or len(children) < 2:
                continue
            port = cmd[cmd.index("--port") + 1]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/loads", timeout=2) as resp:
                    loads = json.loads(resp.read())["loads"]
                if sum(entry["num_running_reqs"] for entry in loads) > 0:
                    return children
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.2)
    raise AssertionError("the envelope never started sending requests")


def _ports(config: Path) -> list[int]:
    if not config.exists():
        return []
    cfg = tomllib.loads(config.read_text())
    return [cfg["server"]["port"], cfg["launch"]["eagle"]["port"], cfg["launch"]["plain"]["port"]]


def _wait_for_traffic(config: Path, proc: subprocess.Popen[bytes]) -> None:
    """Return once the sweep is under way: the EAGLE server (swept first) is decoding requests."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        ports = _ports(config)
        if ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/v1/loads", timeout=2) as resp:
                    loads = json.loads(resp.read())["loads"]
                if sum(entry["num_running_reqs"] for entry in loads) > 0:
                    return
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.2)
    raise AssertionError("the envelope never started sending requests")
