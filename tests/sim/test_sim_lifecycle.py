"""Process lifecycle and configuration: warm-up, SIGTERM drain, auth, metrics switch, CLI errors."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from backends.sim.server import READY_MESSAGE as READY_LINE
from backends.testbed import SimFactory

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_startup_delay_answers_503_then_200(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain", "--startup-delay", "1.5", wait_ready=False)
    started = time.monotonic()
    for path in ("/ready", "/health", "/health_generate"):
        resp = httpx.get(sim.url() + path)
        assert resp.status_code == 503 and resp.content == b""
    assert READY_LINE not in sim.log()
    while httpx.get(sim.url() + "/ready").status_code != 200:
        assert time.monotonic() - started < 10
        time.sleep(0.05)
    assert time.monotonic() - started >= 1.0
    assert httpx.get(sim.url() + "/health").status_code == 200
    assert READY_LINE in sim.log()


def test_sigterm_drains_running_requests_then_exits_zero(sims: SimFactory) -> None:
    sim = sims.start("--role", "eagle", "--time-scale", "0.5")
    # Long enough to be still draining when the checks below run, even on a loaded machine.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", sim.url() + "/v1/chat/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        next(lines)
        sim.signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while "draining 1 requests" not in sim.log():  # logged once it has stopped reporting ready
            assert time.monotonic() < deadline, sim.log()
            time.sleep(0.01)
        assert httpx.get(sim.url() + "/ready").status_code == 503
        assert httpx.get(sim.url() + "/health").status_code == 503
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"  # the in-flight stream finished normally
    assert sim.wait(timeout=30) == 0
    assert "draining 1 requests" in sim.log()


def test_sigterm_with_nothing_running_exits_at_once(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain")
    sim.signal(signal.SIGTERM)
    assert sim.wait(timeout=5) == 0


def test_api_keys(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain", "--api-key", "user-key", "--admin-api-key", "admin-key", "--enable-metrics")
    base = sim.url()
    denied = httpx.get(base + "/v1/models")
    assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
    assert httpx.get(base + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(base + "/v1/loads").status_code == 401
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(base + path).status_code == 200, path
    user = {"Authorization": "Bearer user-key"}
    admin = {"Authorization": "Bearer admin-key"}
    assert httpx.get(base + "/server_info", headers=user).status_code == 200
    assert httpx.post(base + "/abort_request", json={"rid": "x"}, headers=user).status_code == 401
    assert httpx.post(base + "/abort_request", json={"rid": "x"}, headers=admin).status_code == 200

    client = openai.OpenAI(base_url=base + "/v1", api_key="user-key", max_retries=0)
    assert client.completions.create(model="m", prompt="x", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0).models.list()
    info = httpx.get(base + "/server_info", headers=user).text
    assert "user-key" not in info and "admin-key" not in info


def test_metrics_are_off_without_the_flag(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain")
    assert httpx.get(sim.url() + "/metrics").status_code == 404


def test_overrides_reach_the_reports(sims: SimFactory, tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text("[plain]\nt0_ms = 9.0\n")
    sim = sims.start(
        "--role",
        "plain",
        "--profile",
        "llama8b-h100",
        "--profile-file",
        str(profile),
        "--max-running-requests",
        "7",
        "--served-model-name",
        "my-model",
    )
    info = httpx.get(sim.url() + "/server_info").json()
    assert info["max_running_requests"] == 7 and info["served_model_name"] == "my-model"
    assert info["sim"]["profile"]["plain"]["t0_ms"] == 9.0 and info["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in info["internal_states"][0]
    assert httpx.get(sim.url() + "/v1/loads").json()["loads"][0]["max_running_requests"] == 7
    assert httpx.get(sim.url() + "/v1/models").json()["data"][0]["id"] == "my-model"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--role", "eagle"], "give --role and --port"),
        (["--colocated", "--role", "eagle", "--eagle-port", "0", "--plain-port", "0"], "--colocated runs both roles"),
        (["--colocated", "--eagle-port", "0"], "--colocated needs an EAGLE and a plain server"),
        (
            ["--colocated", "--eagle-port", "0", "--eagle-port", "0", "--plain-port", "0"],
            "got 2 --eagle-port and 1 --plain-port",
        ),
        (["--role", "plain", "--port", "0", "--plain-mem-fraction", "0.4"], "only apply with --colocated"),
        (["--role", "eagle", "--port", "0", "--eagle-only-port", "0"], "only apply with --colocated"),
        (["--colocated", "--eagle-only-port", "0"], "--colocated needs an EAGLE and a plain server"),
        (["--colocated", "--eagle-port", "0", "--plain-port", "0", "--eagle-mem-fraction", "1"], "--eagle-mem-fraction"),
        (
            ["--colocated", "--eagle-port", "0", "--plain-port", "0", "--max-running-requests", "4"],
            "--colocated sets each role's cap",
        ),
        (["--role", "eagle", "--port", "0", "--eagle-max-running-requests", "4"], "only apply with --colocated"),
        (["--role", "eagle", "--port", "0", "--extra-metric-labels", "{bad"], "not valid JSON"),
        (["--role", "eagle", "--port", "0", "--time-scale", "0"], "--time-scale: Input should be greater than 0"),
        (["--role", "eagle", "--port", "0", "--served-model-name", "a:b"], "may not contain ':'"),
        (["--role", "eagle", "--port", "0", "--test-fault", "crash"], "at start a fault is one of"),
        (["--role", "eagle", "--port", "0", "--test-fault", '{"kind": "slow_first_token"}'], "seconds"),
    ],
)
def test_bad_command_lines_exit_2_with_a_reason(args: list[str], needle: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backends.sim", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert needle in done.stderr


def test_bad_profile_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[eagle]\nwhat = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "backends.sim", "--role", "eagle", "--port", "0", "--profile-file", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "eagle.what" in done.stderr


def test_port_in_use_is_a_clear_error(sims: SimFactory) -> None:
    taken = sims.start("--role", "plain").ports["plain"]
    done = subprocess.run(
        [sys.executable, "-m", "backends.sim", "--role", "eagle", "--port", str(taken)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1 and "cannot serve" in done.stderr
