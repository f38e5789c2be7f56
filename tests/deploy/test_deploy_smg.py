"""SMG as the cluster router in deploy/k8s: it discovers exactly the specgate pods, on their port, with
the RBAC to do so, routes by load, and runs the SMG version CI tests against specgate nodes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.deploy_checks import load_manifests

K8S = "deploy/k8s"


def _resources(repo: Path) -> list[dict[str, Any]]:
    return load_manifests(sorted(p for p in (repo / K8S).glob("*.yaml") if p.name != "kustomization.yaml"))


def _one(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def _flags(args: list[str]) -> dict[str, list[str]]:
    """SMG's argv as flag -> values (`--flag=value` and `--flag v1 v2` both)."""
    flags: dict[str, list[str]] = {}
    current = ""
    for arg in args:
        if arg.startswith("--"):
            current, _, value = arg.partition("=")
            flags[current] = [value] if value else []
        else:
            flags[current].append(arg)
    return flags


def _labels(selector_values: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for value in selector_values)


def test_smg_discovers_exactly_the_specgate_pods_on_their_port(repo: Path) -> None:
    resources = _resources(repo)
    specgate_pod = _one(resources, "Deployment", "specgate")["spec"]["template"]
    smg_deployment = _one(resources, "Deployment", "smg")
    (container,) = smg_deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["smg", "launch"]
    flags = _flags(container["args"])
    assert "--service-discovery" in flags
    selector = _labels(flags["--selector"])
    assert all(specgate_pod["metadata"]["labels"].get(k) == v for k, v in selector.items())
    smg_labels = smg_deployment["spec"]["template"]["metadata"]["labels"]
    assert not all(smg_labels.get(k) == v for k, v in selector.items()), "SMG must not discover itself"
    (specgate,) = specgate_pod["spec"]["containers"]
    http_port = {p["name"]: p["containerPort"] for p in specgate["ports"]}["http"]
    assert flags["--service-discovery-port"] == [str(http_port)]
    namespace = yaml.safe_load((repo / K8S / "kustomization.yaml").read_text())["namespace"]
    assert flags["--service-discovery-namespace"] == [namespace]
    # The load-aware policy that reads each node's /v1/loads; a node leaves rotation when /ready fails.
    assert flags["--policy"] == ["power_of_two"]
    assert flags["--power-of-two-load-metric"] == ["expected_wait"]
    assert flags["--health-check-endpoint"] == ["/ready"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert flags["--port"] == [str(ports["http"])] and flags["--prometheus-port"] == [str(ports["smg-metrics"])]


def test_smg_may_read_the_pods_of_its_namespace_and_nothing_else(repo: Path) -> None:
    resources = _resources(repo)
    account = _one(resources, "Deployment", "smg")["spec"]["template"]["spec"]["serviceAccountName"]
    _one(resources, "ServiceAccount", account)
    namespace = yaml.safe_load((repo / K8S / "kustomization.yaml").read_text())["namespace"]
    bindings = [
        b
        for b in resources
        if b["kind"] == "RoleBinding"
        and {"kind": "ServiceAccount", "name": account, "namespace": namespace} in b["subjects"]
    ]
    (binding,) = bindings
    assert binding["roleRef"]["kind"] == "Role"  # namespaced: no cluster-wide pod access
    role = _one(resources, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_clients_reach_smg_and_smg_runs_the_version_ci_tests(repo: Path) -> None:
    resources = _resources(repo)
    service = _one(resources, "Service", "smg")
    pod_labels = _one(resources, "Deployment", "smg")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    kustomization = yaml.safe_load((repo / K8S / "kustomization.yaml").read_text())
    (image,) = [i for i in kustomization["images"] if i["name"] == "smg"]
    pinned = re.search(r'"smg==([\d.]+)"', (repo / ".ci" / "run").read_text())
    assert pinned is not None, ".ci/run installs a pinned smg"
    assert image["newTag"] == pinned[1]
