"""Start processes and a real Prometheus for the end-to-end deploy checks, and read what it scraped.

Shared by the `prometheus` marker (Prometheus against `specgate serve` on the host) and the `image`
marker (Prometheus against the container image's published ports).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.process import Child, free_loopback_port
from tests.deploy.deploy_checks import dashboard_queries
from tests.deploy.deploy_metrics import referenced_metrics
from tests.deploy.tools import find_tool

PROM = "deploy/prometheus"


def wait_until(check: Callable[[], Any], what: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> Any:
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
def child(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A child process in its own process group, always stopped (group-wide) on exit."""
    process = Child(Path(argv[0]).name, argv, env=env, log_path=log)
    process.start()
    try:
        assert process.proc is not None
        yield process.proc
    finally:
        process.stop_blocking(grace=30)


def get(url: str, **params: str) -> httpx.Response | None:
    """GET, or None while nothing answers."""
    try:
        return httpx.get(url, params=params, timeout=5)
    except httpx.TransportError:
        return None


def answers(url: str, status: int = 200) -> bool:
    """True once `url` answers a GET with `status`."""
    response = get(url)
    return response is not None and response.status_code == status


def point_config_at(repo: Path, tmp: Path, hosts: dict[str, str]) -> Path:
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


@contextmanager
def running_prometheus(config: Path, tmp: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Debian's Prometheus on a free loopback port with `config`; yields its URL and process once ready."""
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        find_tool("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with child(argv, tmp / "prometheus.log") as proc:
        wait_until(lambda: answers(f"{url}/-/ready"), "prometheus ready", 60, proc)
        yield url, proc


def query(prom: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector (empty while Prometheus does not answer)."""
    response = get(f"{prom}/api/v1/query", query=promql)
    if response is None or response.status_code != 200:
        return []
    return response.json()["data"]["result"]


# Series that exist only after something went wrong, with a policy that models speed, or with tenants
# configured (the node these checks start serves without API keys).
EVENT_ONLY = {
    "specgate_upstream_errors_total",
    "specgate_policy_predicted_tpot_seconds",
    "specgate_policy_crossover_concurrency",
    "specgate_tenant_requests_total",
    "specgate_tenant_tokens_total",
}


def assert_node_scraped(repo: Path, prom: str, proc: subprocess.Popen[bytes] | None, requests: int) -> None:
    """Prometheus scraped one node (the gateway and both SGLang servers) the way the dashboard and alerts need.

    `requests` is how many requests the gateway has served; the scraped counter must show exactly that.
    `proc` is Prometheus's process where the test started it (its exit ends the waits early).
    """
    served = wait_until(
        lambda: [s for s in query(prom, "sum(specgate_requests_total)") if float(s["value"][1]) >= requests],
        f"Prometheus to scrape the {requests} requests",
        30,
        proc,
    )
    assert float(served[0]["value"][1]) == requests

    wait_until(lambda: len(query(prom, "up == 1")) == 3, "all 3 scrape targets up", 30, proc)
    up = {(s["metric"]["job"], s["metric"].get("backend", "")) for s in query(prom, "up")}
    assert up == {("specgate", ""), ("sglang", "eagle"), ("sglang", "plain")}

    # The gateway's series that the dashboard and alerts read were all scraped.
    names = set(get(f"{prom}/api/v1/label/__name__/values").json()["data"])  # type: ignore[union-attr]
    queries = dashboard_queries(repo / "deploy/grafana/dashboards/specgate.json")
    used = set().union(*(referenced_metrics(e) for _, e in queries))
    rules = yaml.safe_load((repo / PROM / "rules/specgate.rules.yml").read_text())
    used |= set().union(*(referenced_metrics(r["expr"]) for g in rules["groups"] for r in g["rules"]))
    wanted = {n for n in used if n.startswith("specgate_")} - EVENT_ONLY
    assert wanted - names == set()
    assert {s["metric"]["backend"] for s in query(prom, "specgate_route_decisions_total")} <= {"eagle", "plain"}

    # SGLang's own series, from the simulated servers, labelled like the real ones.
    queue = {(s["metric"]["backend"], s["metric"]["pool"]) for s in query(prom, "sglang:num_queue_reqs")}
    assert queue == {("eagle", "eagle"), ("plain", "plain")}
    assert {s["metric"]["backend"] for s in query(prom, "sglang:spec_accept_length")} == {"eagle"}

    # The repository's alert rules loaded, and nothing fires on a healthy node.
    groups = get(f"{prom}/api/v1/rules").json()["data"]["groups"]  # type: ignore[union-attr]
    alerts = {r["name"]: r["state"] for g in groups for r in g["rules"]}
    assert "SpecgateBackendDown" in alerts and "SpecgateSpeculationSlowerThanPlain" in alerts
    assert {name for name, state in alerts.items() if state != "inactive"} == set(), json.dumps(alerts)
