"""Kubernetes manifests: schema validation, cross-references, and the one-pod-per-node contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.plan import build_plan
from gateway.config import load_settings
from tests.deploy.deploy_checks import (
    k8s_reference_problems,
    kustomization_problems,
    load_manifests,
)
from tests.deploy.tools import find_tool, run_tool

K8S = "deploy/k8s"
# Resources whose schema kubernetes-validate ships (the ServiceMonitor is a CRD: see the reference checks).
CORE_MANIFESTS = [
    "namespace.yaml",
    "models-pvc.yaml",
    "deployment.yaml",
    "service.yaml",
    "poddisruptionbudget.yaml",
    "smg-rbac.yaml",
    "smg.yaml",
]


def _manifests(k8s_dir: Path) -> list[dict[str, Any]]:
    return load_manifests(sorted(p for p in k8s_dir.glob("*.yaml") if p.name != "kustomization.yaml"))


def _generated_configmaps(k8s_dir: Path) -> set[str]:
    kustomization = yaml.safe_load((k8s_dir / "kustomization.yaml").read_text())
    return {gen["name"] for gen in kustomization.get("configMapGenerator", [])}


def _one(resources: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == kind and name in (None, r["metadata"]["name"])]
    return found


def test_kustomization_lists_every_manifest_and_file(repo: Path) -> None:
    assert kustomization_problems(repo / K8S) == []


def test_references_resolve(repo: Path) -> None:
    assert k8s_reference_problems(_manifests(repo / K8S), _generated_configmaps(repo / K8S)) == []


def test_one_pod_per_8_gpu_node_with_probes_on_the_gateway(repo: Path) -> None:
    deployment = _one(_manifests(repo / K8S), "Deployment", "specgate")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    probes = {p: container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": "/ready", "readinessProbe": "/ready", "livenessProbe": "/metrics"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/specgate"]]["configMap"]["name"] == "specgate-config"
    assert "persistentVolumeClaim" in volumes[mounts["/models"]]
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_configmap_config_is_valid_and_matches_the_pod_ports(repo: Path) -> None:
    settings = load_settings(repo / K8S / "specgate.toml")
    plan = build_plan(settings.launch, eagle_cap=settings.resolved_policy.eagle_cap)
    assert plan.warnings == ()
    assert settings.security.metrics_public  # the liveness probe and ServiceMonitor read /metrics without a key
    resources = _manifests(repo / K8S)
    (container,) = _one(resources, "Deployment", "specgate")["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": settings.server.port,
        "eagle-metrics": settings.launch.eagle.port,
        "plain-metrics": settings.launch.plain.port,
    }
    assert {settings.server.host, settings.launch.eagle.host, settings.launch.plain.host} == {"0.0.0.0"}
    # The ServiceMonitor gives the same job/backend labels as the compose scrape config.
    monitor = _one(resources, "ServiceMonitor")
    labels = {
        e["port"]: {r["targetLabel"]: r["replacement"] for r in e.get("relabelings", [])}
        for e in monitor["spec"]["endpoints"]
    }
    assert labels == {
        "http": {"job": "specgate"},
        "eagle-metrics": {"job": "sglang", "backend": "eagle"},
        "plain-metrics": {"job": "sglang", "backend": "plain"},
    }


def _write(path: Path, resources: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump_all(resources))


def test_reference_check_fails_on_broken_copy(deploy_copy: Path) -> None:
    k8s = deploy_copy / K8S
    monitor = yaml.safe_load((k8s / "servicemonitor.yaml").read_text())
    monitor["spec"]["endpoints"][1]["port"] = "eagle"
    _write(k8s / "servicemonitor.yaml", [monitor])
    services = list(yaml.safe_load_all((k8s / "service.yaml").read_text()))
    services[0]["spec"]["selector"]["app.kubernetes.io/component"] = "gatway"
    _write(k8s / "service.yaml", services)
    problems = k8s_reference_problems(_manifests(k8s), _generated_configmaps(k8s))
    assert problems == [
        "Service specgate: selector matches no pod",
        "ServiceMonitor specgate: port eagle is on no selected Service",
    ]


def test_kustomization_check_fails_on_broken_copy(deploy_copy: Path) -> None:
    k8s = deploy_copy / K8S
    (k8s / "poddisruptionbudget.yaml").unlink()
    (k8s / "extra.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n")
    assert kustomization_problems(k8s) == [
        "resource poddisruptionbudget.yaml does not exist",
        "extra.yaml is not listed in kustomization.yaml resources",
    ]


@pytest.mark.deploy
@pytest.mark.parametrize("manifest", CORE_MANIFESTS)
def test_manifest_validates_against_the_kubernetes_schema(repo: Path, manifest: str) -> None:
    result = run_tool(find_tool("kubernetes-validate"), "--strict", str(repo / K8S / manifest))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN" not in result.stdout  # a kind without a schema would pass silently
    assert "passed for resource" in result.stdout


def test_every_core_manifest_is_schema_checked(repo: Path) -> None:
    kustomization = yaml.safe_load((repo / K8S / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) - set(CORE_MANIFESTS) == {"servicemonitor.yaml"}


@pytest.mark.deploy
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("      maxSurge: 0 ", "      maxSurgee: 0 "),  # unknown field (strict)
        ("terminationGracePeriodSeconds: 150", "terminationGracePeriodSeconds: two-minutes"),  # wrong type
    ],
)
def test_schema_check_fails_on_broken_copy(deploy_copy: Path, old: str, new: str) -> None:
    manifest = deploy_copy / K8S / "deployment.yaml"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new, 1))
    result = run_tool(find_tool("kubernetes-validate"), "--strict", str(manifest))
    assert result.returncode != 0
    assert "did not validate" in result.stdout
