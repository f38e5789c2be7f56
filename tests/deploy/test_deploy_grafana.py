"""The Grafana dashboard: valid JSON, datasources that resolve, queries naming real metrics, valid PromQL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_checks import (
    dashboard_problems,
    dashboard_queries,
    provisioned_datasources,
)
from tests.deploy.deploy_metrics import known_series, referenced_metrics
from tests.deploy.tools import find_tool, run_tool

DASHBOARD = "deploy/grafana/dashboards/specgate.json"
PROVISIONING = "deploy/grafana/provisioning"
# What issue 6 asks the dashboard to show, as the series its queries must read.
REQUIRED_SERIES = {
    "specgate_inflight_requests",
    "specgate_route_decisions_total",
    "specgate_output_tokens_total",
    "specgate_time_to_first_token_seconds_bucket",
    "specgate_inter_token_latency_seconds_bucket",
    "specgate_request_duration_seconds_bucket",
    "specgate_gateway_overhead_seconds_bucket",
    "specgate_backend_up",
    "specgate_backend_restarts_total",
    "sglang:spec_accept_length",
    "sglang:num_queue_reqs",
}
# Grafana's built-in variables, replaced by durations for promtool.
GRAFANA_RANGES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def _check(repo: Path, dashboard: Path) -> list[str]:
    return dashboard_problems(dashboard, provisioned_datasources(repo / PROVISIONING), known_series())


def test_dashboard_resolves_datasources_and_names_known_metrics(repo: Path) -> None:
    assert _check(repo, repo / DASHBOARD) == []


def test_dashboard_shows_what_the_issue_asks_for(repo: Path) -> None:
    queries = dashboard_queries(repo / DASHBOARD)
    used = set().union(*(referenced_metrics(expr) for _, expr in queries))
    assert REQUIRED_SERIES <= used
    for series in ("time_to_first_token", "inter_token_latency", "request_duration"):
        exprs = [e for _, e in queries if f"specgate_{series}_seconds_bucket" in e]
        assert any("histogram_quantile(0.5," in e for e in exprs) and any("histogram_quantile(0.99," in e for e in exprs)
        assert all("by (backend, le)" in e for e in exprs)  # per backend


def test_each_tenant_gets_a_panel_of_its_requests_tokens_and_429s(repo: Path) -> None:
    dash = json.loads((repo / DASHBOARD).read_text())
    tenant = next(v for v in dash["templating"]["list"] if v["name"] == "tenant")
    assert tenant["multi"] and tenant["includeAll"] and "specgate_tenant_requests_total" in tenant["definition"]
    (panel,) = [p for p in dash["panels"] if p.get("repeat") == "tenant"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert all('tenant=~"$tenant"' in e for e in exprs)
    used = set().union(*(referenced_metrics(e) for e in exprs))
    assert used == {"specgate_tenant_requests_total", "specgate_tenant_tokens_total"}
    assert any('status="429"' in e for e in exprs)


def test_provisioning_files_are_valid(repo: Path) -> None:
    assert provisioned_datasources(repo / PROVISIONING) == {"specgate-prometheus": "prometheus"}
    provider = yaml.safe_load((repo / PROVISIONING / "dashboards/specgate.yml").read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["type"] == "file"


def _break(dashboard: Path, old: str, new: str) -> None:
    text = dashboard.read_text()
    assert old in text
    dashboard.write_text(text.replace(old, new, 1))


def test_check_fails_on_invalid_json(repo: Path, deploy_copy: Path) -> None:
    dashboard = deploy_copy / DASHBOARD
    _break(dashboard, '"panels": [', '"panels": [,')
    assert any("not valid JSON" in p for p in _check(repo, dashboard))


def test_check_fails_on_unprovisioned_datasource(repo: Path, deploy_copy: Path) -> None:
    dashboard = deploy_copy / DASHBOARD
    _break(dashboard, '"value": "specgate-prometheus"', '"value": "some-other-prometheus"')
    problems = _check(repo, dashboard)
    assert problems and all("'some-other-prometheus' is not provisioned" in p for p in problems)


def test_check_fails_on_panel_with_a_literal_unknown_uid(repo: Path, deploy_copy: Path) -> None:
    dashboard = deploy_copy / DASHBOARD
    dash = json.loads(dashboard.read_text())
    dash["panels"][1]["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
    dashboard.write_text(json.dumps(dash))
    assert _check(repo, dashboard) == [
        f"{dash['panels'][1]['title']}: datasource uid 'P1809F7CD0C75ACF3' is not provisioned (provisioned: ['specgate-prometheus'])"
    ]


def test_check_fails_on_unknown_metric(repo: Path, deploy_copy: Path) -> None:
    dashboard = deploy_copy / DASHBOARD
    _break(dashboard, "sglang:num_queue_reqs", "sglang:num_queued_reqs")
    assert _check(repo, dashboard) == ["SGLang queued requests: unknown metric sglang:num_queued_reqs"]


def _as_rules_file(queries: list[tuple[str, str]], path: Path) -> Path:
    """Every query as a recording rule, so `promtool check rules` parses it."""
    pattern = re.compile("|".join(re.escape(k) for k in GRAFANA_RANGES))
    rules = [
        {"record": f"dashboard:query_{i}", "expr": pattern.sub(lambda m: GRAFANA_RANGES[m.group(0)], expr)}
        for i, (_, expr) in enumerate(queries)
    ]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


@pytest.mark.deploy
def test_every_query_is_valid_promql(repo: Path, tmp_path: Path) -> None:
    rules = _as_rules_file(dashboard_queries(repo / DASHBOARD), tmp_path / "dashboard.rules.yml")
    result = run_tool(find_tool("promtool"), "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.deploy
def test_promql_check_fails_on_broken_query(repo: Path, deploy_copy: Path, tmp_path: Path) -> None:
    dashboard = deploy_copy / DASHBOARD
    _break(dashboard, "sum by (backend) (specgate_inflight_requests)", "sum by (backend) (specgate_inflight_requests")
    rules = _as_rules_file(dashboard_queries(dashboard), tmp_path / "dashboard.rules.yml")
    result = run_tool(find_tool("promtool"), "check", "rules", str(rules))
    assert result.returncode != 0
