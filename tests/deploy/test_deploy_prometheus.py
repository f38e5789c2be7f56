"""Prometheus scrape config and alert rules: promtool checks, rule unit tests, metric names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_checks import alerts_without_firing_test, rule_problems
from tests.deploy.deploy_metrics import known_series
from tests.deploy.tools import find_tool, run_tool

PROM = "deploy/prometheus"
RULES = f"{PROM}/rules/specgate.rules.yml"
RULE_TESTS = f"{PROM}/tests/specgate.rules.test.yml"
# The alerts issue 6 asks for, by what they watch.
REQUIRED_ALERTS = {
    "SpecgateBackendDown",
    "SpecgateSpeculationSlowerThanPlain",
    "SpecgateTTFTP99OverSLO",
    "SpecgateHighErrorRate",
    "SpecgateBackendRestarted",
}


def _alerts(rules_file: Path) -> list[dict]:
    return [r for g in yaml.safe_load(rules_file.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_rules_name_only_exported_metrics(repo: Path) -> None:
    assert rule_problems(repo / RULES, known_series()) == []
    assert REQUIRED_ALERTS <= {a["alert"] for a in _alerts(repo / RULES)}


def test_rule_check_fails_on_unknown_metric(deploy_copy: Path) -> None:
    rules = deploy_copy / RULES
    rules.write_text(rules.read_text().replace("specgate_backend_up == 0", "specgate_backends_up == 0", 1))
    assert rule_problems(rules, known_series()) == ["SpecgateBackendDown: unknown metric specgate_backends_up"]


def test_every_alert_has_a_firing_test_case(repo: Path) -> None:
    assert alerts_without_firing_test(repo / RULES, repo / RULE_TESTS) == set()


def test_coverage_check_fails_when_an_alert_is_never_expected_to_fire(deploy_copy: Path) -> None:
    tests_file = deploy_copy / RULE_TESTS
    doc = yaml.safe_load(tests_file.read_text())
    doc["tests"] = [t for t in doc["tests"] if t["name"] != "error rate over 5%"]
    tests_file.write_text(yaml.safe_dump(doc))
    assert alerts_without_firing_test(deploy_copy / RULES, tests_file) == {"SpecgateHighErrorRate"}


@pytest.mark.deploy
def test_promtool_accepts_config_and_rules(repo: Path) -> None:
    promtool = find_tool("promtool")
    config = run_tool(promtool, "check", "config", "prometheus.yml", cwd=repo / PROM)
    assert config.returncode == 0, config.stdout + config.stderr
    assert "1 rule files found" in config.stdout  # the glob reached the rules
    rules = run_tool(promtool, "check", "rules", str(repo / RULES))
    assert rules.returncode == 0, rules.stdout + rules.stderr


@pytest.mark.deploy
def test_promtool_check_config_fails_on_broken_copy(deploy_copy: Path) -> None:
    config = deploy_copy / PROM / "prometheus.yml"
    config.write_text(config.read_text().replace("scrape_interval: 5s", "scrape_interval: 5 seconds", 1))
    result = run_tool(find_tool("promtool"), "check", "config", str(config))
    assert result.returncode != 0


@pytest.mark.deploy
def test_promtool_check_rules_fails_on_broken_copy(deploy_copy: Path) -> None:
    rules = deploy_copy / RULES
    rules.write_text(rules.read_text().replace("max by (instance) (specgate_backend_up)", "max by (instance (specgate_backend_up)", 1))
    result = run_tool(find_tool("promtool"), "check", "rules", str(rules))
    assert result.returncode != 0


@pytest.mark.deploy
def test_alert_rules_pass_their_unit_tests(repo: Path) -> None:
    result = run_tool(find_tool("promtool"), "test", "rules", str(repo / RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.deploy
@pytest.mark.parametrize("alert", [a["alert"] for a in _alerts(Path(__file__).resolve().parents[2] / RULES)])
def test_rule_unit_tests_fail_when_an_alert_never_fires(deploy_copy: Path, alert: str) -> None:
    rules = deploy_copy / RULES
    doc = yaml.safe_load(rules.read_text())
    for rule in doc["groups"][0]["rules"]:
        if rule.get("alert") == alert:
            rule["expr"] = 'up{job="no-such-job"} == 42'
    rules.write_text(yaml.safe_dump(doc))
    result = run_tool(find_tool("promtool"), "test", "rules", str(deploy_copy / RULE_TESTS))
    assert result.returncode != 0
    assert alert in result.stdout + result.stderr


@pytest.mark.deploy
@pytest.mark.parametrize("moved", ["2.5", "1.05"])  # above the firing case's 2x; below the 1.1x one that must not
def test_rule_unit_tests_fail_when_a_threshold_moves(deploy_copy: Path, moved: str) -> None:
    rules = deploy_copy / RULES
    text = rules.read_text()
    ratio = "\n          > 1.25\n"  # SpecgateSpeculationSlowerThanPlain's eagle/plain time-per-token ratio
    assert text.count(ratio) == 1
    rules.write_text(text.replace(ratio, f"\n          > {moved}\n"))
    result = run_tool(find_tool("promtool"), "test", "rules", str(deploy_copy / RULE_TESTS))
    assert result.returncode != 0
    assert "SpecgateSpeculationSlowerThanPlain" in result.stdout + result.stderr
