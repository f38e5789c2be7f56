"""deploy/docker-compose.yml: parses, references only files that exist, and wires the stack together."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from backends.plan import build_plan
from gateway.config import load_settings
from tests.deploy.deploy_checks import compose_mounts, compose_problems
from tests.deploy.tools import compose_binary, run_tool

COMPOSE = "deploy/docker-compose.yml"
SPECGATE_SERVICES = {"gpu": "specgate", "sim": "specgate-sim"}


def _compose(repo: Path) -> dict:
    return yaml.safe_load((repo / COMPOSE).read_text())


def test_compose_references_only_existing_files(repo: Path) -> None:
    assert compose_problems(repo / COMPOSE) == []


def test_compose_check_fails_on_missing_files(deploy_copy: Path) -> None:
    (deploy_copy / "deploy/compose/specgate-sim.toml").unlink()
    compose = deploy_copy / COMPOSE
    doc = yaml.safe_load(compose.read_text())
    doc["services"]["specgate"]["build"]["target"] = "no-such-stage"
    compose.write_text(yaml.safe_dump(doc))
    problems = compose_problems(compose)
    assert any("specgate-sim.toml does not exist" in p for p in problems), problems
    assert any("no-such-stage is not a stage" in p for p in problems), problems


def test_compose_check_fails_on_invalid_yaml(deploy_copy: Path) -> None:
    compose = deploy_copy / COMPOSE
    compose.write_text(compose.read_text().replace("services:", "services: [", 1))
    assert any("not valid YAML" in p for p in compose_problems(compose))


def test_profiles_split_gpu_and_sim_and_share_one_network_name(repo: Path) -> None:
    services = _compose(repo)["services"]
    gpu, sim = services["specgate"], services["specgate-sim"]
    assert gpu["profiles"] == ["gpu"] and sim["profiles"] == ["sim"]
    assert gpu["build"]["target"] == "runtime" and sim["build"]["target"] == "gateway-only"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "deploy" not in sim  # the sim profile must run without a GPU
    # Prometheus scrapes `specgate`: the GPU service has that name, the sim service that alias.
    assert "specgate" in sim["networks"]["default"]["aliases"]
    assert "profiles" not in services["prometheus"] and "profiles" not in services["grafana"]


@pytest.mark.parametrize("profile", sorted(SPECGATE_SERVICES))
def test_mounted_config_is_valid_and_matches_the_scrape_config(repo: Path, profile: str) -> None:
    compose = repo / COMPOSE
    mounts = compose_mounts(compose, SPECGATE_SERVICES[profile])
    settings = load_settings(mounts["/etc/specgate/specgate.toml"])
    assert settings.launch.engine == ("sglang" if profile == "gpu" else "sim")
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)
    plan = build_plan(settings.launch, eagle_cap=settings.resolved_policy.eagle_cap)
    assert plan.warnings == ()
    # Prometheus (another container) reaches each server on the compose network.
    ports = {role: getattr(settings.launch, role).port for role in ("eagle", "plain")}
    assert {getattr(settings.launch, role).host for role in ports} == {"0.0.0.0"}

    prometheus = compose_mounts(compose, "prometheus")
    scrape = yaml.safe_load(prometheus["/etc/prometheus/prometheus.yml"].read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert jobs["specgate"]["static_configs"][0]["targets"] == ["specgate:8000"]
    targets = {sc["labels"]["backend"]: sc["targets"] for sc in jobs["sglang"]["static_configs"]}
    assert targets == {role: [f"specgate:{port}"] for role, port in ports.items()}
    assert prometheus["/etc/prometheus/rules"] == repo / "deploy/prometheus/rules"


def test_grafana_provisioning_matches_its_mounts(repo: Path) -> None:
    mounts = compose_mounts(repo / COMPOSE, "grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards/specgate.yml").read_text())["providers"][0]
    dashboards_dir = mounts[provider["options"]["path"]]
    assert (dashboards_dir / "specgate.json").is_file()
    datasource = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    env = _compose(repo)["services"]["grafana"]["environment"]
    home = Path(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (mounts[str(home.parent)] / home.name).is_file()


def test_the_tracing_profile_runs_a_collector_the_gateway_can_send_to(repo: Path) -> None:
    services = _compose(repo)["services"]
    assert services["otel-collector"]["profiles"] == ["tracing"] == services["jaeger"]["profiles"]
    collector = yaml.safe_load(compose_mounts(repo / COMPOSE, "otel-collector")["/etc/otelcol/collector.yaml"].read_text())
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    assert collector["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["otlp/jaeger"]
    for name in SPECGATE_SERVICES.values():  # tracing stays off unless SPECGATE_OTLP_ENDPOINT names the collector
        assert services[name]["environment"]["SPECGATE_TELEMETRY__OTLP_ENDPOINT"] == "${SPECGATE_OTLP_ENDPOINT:-}"


@pytest.mark.deploy
@pytest.mark.parametrize("profile", ["gpu", "sim", "tracing"])
def test_compose_file_follows_the_compose_specification(repo: Path, profile: str) -> None:
    result = run_tool(compose_binary(), "-f", str(repo / COMPOSE), "--profile", profile, "config", "--quiet")
    assert result.returncode == 0, result.stderr


@pytest.mark.deploy
def test_compose_specification_check_fails_on_broken_copy(deploy_copy: Path) -> None:
    compose = deploy_copy / COMPOSE
    compose.write_text(compose.read_text().replace("    restart: unless-stopped\n", "    restart_policy: always\n", 1))
    result = run_tool(compose_binary(), "-f", str(compose), "--profile", "gpu", "config", "--quiet")
    assert result.returncode != 0
    assert "restart_policy" in result.stderr
