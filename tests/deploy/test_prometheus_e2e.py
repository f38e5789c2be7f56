"""A real Prometheus (Debian's binary) scrapes a running `specgate serve` with the repo's scrape config.

`specgate serve` runs its embedded default (two simulated SGLang servers) as a child process on free
loopback ports; deploy/prometheus/prometheus.yml is rewritten only where it names the compose
hosts, so the jobs, labels and rule files under test are the repository's own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from backends.process import Child, free_loopback_port
from tests.deploy.deploy_checks import dashboard_queries
from tests.deploy.deploy_metrics import referenced_metrics
from tests.deploy.tools import find_tool

pytestmark = pytest.mark.prometheus

PROM = "deploy/prometheus"
# Series that exist only after something went wrong or with a policy that models speed.
EVENT_ONLY = {
    "specgate_upstream_errors_total",
    "specgate_policy_predicted_tpot_seconds",
    "specgate_policy_crossover_concurrency",
}


def _wait_until(
    check: Callable[[], Any], what: str, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` on timeout or if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}")
        result = check()
        if result:
            return result
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@contextmanager
def _child(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A child process in its own process group, always stopped (group-wide) on exit."""
    child = Child(Path(argv[0]).name, argv, env=env, log_path=log)
    child.start()
    try:
        assert child.proc is not None
        yield child.proc
    finally:
        child.stop_blocking(grace=30)


def _get(url: str, **params: str) -> httpx.Response | None:
    try:
        return httpx.get(url, params=params, timeout=5)
    except httpx.TransportError:
        return None


def _point_config_at(repo: Path, tmp: Path, hosts: dict[str, str]) -> Path:
    """The repo's scrape config with its compose targets replaced, and its rules beside it."""
    config = yaml.safe_load((repo / PROM / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["scrape_timeout"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            unknown = [t for t in static["targets"] if t not in hosts]
            assert not unknown, f"scrape target {unknown} has no local stand-in; update this test with the config"
            static["targets"] = [hosts[t] for t in static["targets"]]
    shutil.copytree(repo / PROM / "rules", tmp / "rules")
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _query(prom: str, promql: str) -> list[dict[str, Any]]:
    response = _get(f"{prom}/api/v1/query", query=promql)
    if response is None or response.status_code != 200:
        return []
    return response.json()["data"]["result"]


def test_prometheus_scrapes_gateway_and_simulated_sglang(repo: Path, tmp_path: Path) -> None:
    prometheus = find_tool("prometheus")
    gw_port, eagle_port, plain_port, prom_port = (free_loopback_port() for _ in range(4))
    gateway = f"http://127.0.0.1:{gw_port}"
    prom = f"http://127.0.0.1:{prom_port}"
    env = {
        "SPECGATE_LAUNCH__EAGLE__PORT": str(eagle_port),
        "SPECGATE_LAUNCH__PLAIN__PORT": str(plain_port),
        "SPECGATE_LAUNCH__TIME_SCALE": "0.1",  # simulated decode 10x faster: short requests
    }
    specgate = [str(Path(sys.executable).parent / "specgate"), "serve", "--host", "127.0.0.1", "--port", str(gw_port)]
    stand_ins = {
        "specgate:8000": f"127.0.0.1:{gw_port}",
        "specgate:30001": f"127.0.0.1:{eagle_port}",
        "specgate:30002": f"127.0.0.1:{plain_port}",
    }
    config = _point_config_at(repo, tmp_path, stand_ins)
    with _child(specgate, tmp_path / "specgate.log", env) as gw_proc:
        _wait_until(lambda: (r := _get(f"{gateway}/ready")) is not None and r.status_code == 200, "specgate /ready", 90, gw_proc)
        prom_argv = [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        with _child(prom_argv, tmp_path / "prometheus.log") as prom_proc:
            _wait_until(
                lambda: (r := _get(f"{prom}/-/ready")) is not None and r.status_code == 200, "prometheus ready", 60, prom_proc
            )

            client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)
            model = client.models.list().data[0].id
            for _ in range(3):
                client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
            stream = client.completions.create(model=model, prompt="hello", max_tokens=8, stream=True)
            assert "".join(c.choices[0].text for c in stream if c.choices)

            served = _wait_until(
                lambda: [s for s in _query(prom, "sum(specgate_requests_total)") if float(s["value"][1]) >= 4],
                "Prometheus to scrape the 4 requests",
                30,
                prom_proc,
            )
            assert float(served[0]["value"][1]) == 4

            _wait_until(lambda: len(_query(prom, "up == 1")) == 3, "all 3 scrape targets up", 30, prom_proc)
            up = {(s["metric"]["job"], s["metric"].get("backend", "")) for s in _query(prom, "up")}
            assert up == {("specgate", ""), ("sglang", "eagle"), ("sglang", "plain")}

            # The gateway's series that the dashboard and alerts read were all scraped.
            names = set(_get(f"{prom}/api/v1/label/__name__/values").json()["data"])  # type: ignore[union-attr]
            queries = dashboard_queries(repo / "deploy/grafana/dashboards/specgate.json")
            used = set().union(*(referenced_metrics(e) for _, e in queries))
            rules = yaml.safe_load((repo / PROM / "rules/specgate.rules.yml").read_text())
            used |= set().union(*(referenced_metrics(r["expr"]) for g in rules["groups"] for r in g["rules"]))
            wanted = {n for n in used if n.startswith("specgate_")} - EVENT_ONLY
            assert wanted - names == set()
            assert {s["metric"]["backend"] for s in _query(prom, "specgate_route_decisions_total")} <= {"eagle", "plain"}

            # SGLang's own series, from the simulated servers, labelled like the real ones.
            queue = {(s["metric"]["backend"], s["metric"]["pool"]) for s in _query(prom, "sglang:num_queue_reqs")}
            assert queue == {("eagle", "eagle"), ("plain", "plain")}
            assert {s["metric"]["backend"] for s in _query(prom, "sglang:spec_accept_length")} == {"eagle"}

            # The repository's alert rules loaded, and nothing fires on a healthy node.
            groups = _get(f"{prom}/api/v1/rules").json()["data"]["groups"]  # type: ignore[union-attr]
            alerts = {r["name"]: r["state"] for g in groups for r in g["rules"]}
            assert "SpecgateBackendDown" in alerts and "SpecgateSpeculationSlowerThanPlain" in alerts
            assert {name for name, state in alerts.items() if state != "inactive"} == set(), json.dumps(alerts)
