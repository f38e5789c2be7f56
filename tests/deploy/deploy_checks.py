"""Static checks of the deploy files that need no external tool.

Each check takes paths (so a test can point it at a broken copy in a tmp dir) and returns the
problems it found as readable strings; an empty list means the files are consistent.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.deploy_metrics import referenced_metrics

# ---- docker compose -------------------------------------------------------------------------


def _local_path(source: str) -> bool:
    # Relative bind mounts are repository files; named volumes and host paths (models) are not.
    return source.startswith(("./", "../"))


def compose_problems(compose_file: Path) -> list[str]:
    """Files the compose file references (build contexts, Dockerfiles, targets, bind mounts) that are missing."""
    try:
        doc = yaml.safe_load(compose_file.read_text())
    except yaml.YAMLError as exc:
        return [f"{compose_file.name}: not valid YAML: {exc}"]
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        return [f"{compose_file.name}: no `services` mapping"]
    base = compose_file.parent
    problems: list[str] = []
    for name, service in doc["services"].items():
        build = service.get("build")
        if build is not None:
            problems += _build_problems(name, base, build)
        elif "image" not in service:
            problems.append(f"service {name}: neither `image` nor `build`")
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if _local_path(source) and not (base / source).exists():
                problems.append(f"service {name}: bind mount source {source} does not exist")
        for env_file in _as_list(service.get("env_file")):
            if not (base / env_file).is_file():
                problems.append(f"service {name}: env_file {env_file} does not exist")
    return problems


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _build_problems(name: str, base: Path, build: Any) -> list[str]:
    spec = {"context": build} if isinstance(build, str) else build
    context = base / spec.get("context", ".")
    if not context.is_dir():
        return [f"service {name}: build context {spec.get('context')} is not a directory"]
    dockerfile = context / spec.get("dockerfile", "Dockerfile")
    if not dockerfile.is_file():
        return [f"service {name}: Dockerfile {dockerfile} does not exist"]
    target = spec.get("target")
    if target is not None and target not in dockerfile_stages(dockerfile):
        return [f"service {name}: build target {target} is not a stage of {dockerfile.name}"]
    return []


def compose_mounts(compose_file: Path, service: str) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    doc = yaml.safe_load(compose_file.read_text())
    mounts: dict[str, Path] = {}
    for volume in doc["services"][service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if _local_path(source):
            mounts[target] = (compose_file.parent / source).resolve()
    return mounts


# ---- Dockerfile -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    stage: str
    keyword: str
    args: str


def dockerfile_instructions(dockerfile: Path) -> Iterator[Instruction]:
    """The instructions of a Dockerfile in order, each tagged with its stage name."""
    logical: list[str] = []
    current = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        current = f"{current} {line[:-1].strip()}" if line.endswith("\\") else f"{current} {line}"
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    stage = ""
    for text in logical:
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)\s*$", args, re.IGNORECASE)
            stage = match.group(1) if match else ""
        yield Instruction(stage, keyword, args.strip())


def dockerfile_stages(dockerfile: Path) -> list[str]:
    """Stage names, in order."""
    return [i.stage for i in dockerfile_instructions(dockerfile) if i.keyword == "FROM"]


ENTRYPOINT = ["specgate", "serve", "--config", "/etc/specgate/specgate.toml"]
SGLANG_BASE = re.compile(r"^lmsysorg/sglang:v0\.5\.23-cu130(-runtime)?$")


def dockerfile_problems(dockerfile: Path, dockerignore: Path) -> list[str]:
    """The image contract of issue 6: targets, base image, user, health check, entrypoint, build inputs."""
    instructions = list(dockerfile_instructions(dockerfile))
    args = {
        i.args.split("=", 1)[0]: i.args.split("=", 1)[1]
        for i in instructions
        if i.keyword == "ARG" and not i.stage and "=" in i.args
    }
    problems: list[str] = []
    stages = dockerfile_stages(dockerfile)
    if stages[-1:] != ["runtime"]:
        problems.append(f"the last stage (what a plain `docker build` produces) must be `runtime`, got {stages[-1:]}")
    if "gateway-only" not in stages:
        problems.append("no `gateway-only` stage")
    for stage in ("runtime", "gateway-only"):
        problems += [f"{stage}: {p}" for p in _final_stage_problems([i for i in instructions if i.stage == stage])]
    runtime_from = next((i.args.split()[0] for i in instructions if i.keyword == "FROM" and i.stage == "runtime"), "")
    base = args.get(runtime_from.strip("${}"), runtime_from)
    if not SGLANG_BASE.match(base):
        problems.append(f"runtime must be based on lmsysorg/sglang v0.5.23 with CUDA 13 (cu130), got {base!r}")
    problems += _copy_problems(instructions, dockerfile.parent, dockerignore)
    return problems


def _final_stage_problems(stage: list[Instruction]) -> list[str]:
    if not stage:
        return ["missing"]
    problems: list[str] = []
    users = [i.args for i in stage if i.keyword == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("does not switch to a non-root USER")
    health = [i.args for i in stage if i.keyword == "HEALTHCHECK"]
    if not health or "/health" not in health[-1]:
        problems.append("no HEALTHCHECK on /health")
    entry = [i.args for i in stage if i.keyword == "ENTRYPOINT"]
    if not entry or json.loads(entry[-1]) != ENTRYPOINT:
        problems.append(f"ENTRYPOINT must be {ENTRYPOINT}, got {entry[-1:] or None}")
    return problems


def _copy_problems(instructions: list[Instruction], context: Path, dockerignore: Path) -> list[str]:
    patterns = [p.strip() for p in dockerignore.read_text().splitlines() if p.strip() and not p.startswith("#")]
    problems: list[str] = []
    for i in instructions:
        if i.keyword not in ("COPY", "ADD") or "--from=" in i.args:
            continue
        for source in [a for a in i.args.split() if not a.startswith("--")][:-1]:
            if not (context / source).exists():
                problems.append(f"COPY source {source} does not exist")
            elif _docker_ignored(source, patterns):
                problems.append(f"COPY source {source} is excluded by .dockerignore")
    return problems


def _docker_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches decides; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        clean = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, clean) or fnmatch.fnmatch(path, f"{clean}/*"):
            ignored = not negate
    return ignored


# ---- Prometheus rules -----------------------------------------------------------------------


def rule_problems(rules_file: Path, known: frozenset[str]) -> list[str]:
    """Alerts without severity/summary, or whose expression names metrics nothing exports."""
    doc = yaml.safe_load(rules_file.read_text())
    problems: list[str] = []
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            used = referenced_metrics(rule.get("expr", ""))
            if not used:
                problems.append(f"{name}: expression names no specgate or SGLang metric")
            problems += [f"{name}: unknown metric {m}" for m in sorted(used - known)]
            if "alert" in rule:
                if rule.get("labels", {}).get("severity") not in ("warning", "critical"):
                    problems.append(f"{name}: severity must be warning or critical")
                if not rule.get("annotations", {}).get("summary"):
                    problems.append(f"{name}: no summary annotation")
    return problems


def alerts_without_firing_test(rules_file: Path, test_file: Path) -> set[str]:
    """Alerts of `rules_file` that no `promtool test rules` case in `test_file` expects to fire."""
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(rules_file.read_text()).get("groups", [])
        for rule in group.get("rules", [])
        if "alert" in rule
    }
    fired = {
        case["alertname"]
        for test in yaml.safe_load(test_file.read_text()).get("tests", [])
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    return alerts - fired


# ---- Grafana --------------------------------------------------------------------------------


def provisioned_datasources(provisioning_dir: Path) -> dict[str, str]:
    """uid -> type of every datasource Grafana provisions from `provisioning_dir/datasources`."""
    sources: dict[str, str] = {}
    for path in sorted((provisioning_dir / "datasources").glob("*.y*ml")):
        for ds in yaml.safe_load(path.read_text()).get("datasources", []):
            sources[ds["uid"]] = ds["type"]
    return sources


def dashboard_problems(dashboard_file: Path, datasources: dict[str, str], known: frozenset[str]) -> list[str]:
    """Invalid JSON, panels whose datasource does not resolve, queries naming unknown metrics."""
    try:
        dash = json.loads(dashboard_file.read_text())
    except json.JSONDecodeError as exc:
        return [f"{dashboard_file.name}: not valid JSON: {exc}"]
    problems: list[str] = []
    if not dash.get("uid") or not dash.get("title"):
        problems.append("dashboard needs a uid and a title")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ids = [p.get("id") for p in _panels(dash)]
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids repeat: {ids}")
    for panel in _panels(dash):
        if panel.get("type") == "row":
            continue
        title = panel.get("title", f"panel {panel.get('id')}")
        refs = [panel.get("datasource")] + [t.get("datasource", panel.get("datasource")) for t in panel.get("targets", [])]
        problems += [f"{title}: {p}" for ref in refs for p in _datasource_problems(ref, variables, datasources)]
        if not panel.get("targets"):
            problems.append(f"{title}: no queries")
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            used = referenced_metrics(expr)
            if not used:
                problems.append(f"{title}: query {target.get('refId')} names no specgate or SGLang metric")
            problems += [f"{title}: unknown metric {m}" for m in sorted(used - known)]
    return problems


def _panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _datasource_problems(ref: Any, variables: dict[str, Any], datasources: dict[str, str]) -> list[str]:
    if not isinstance(ref, dict) or "uid" not in ref:
        return [f"datasource must name a uid, got {ref!r}"]
    uid = ref["uid"]
    var = re.fullmatch(r"\$\{?(\w+)\}?", uid)
    if var:
        variable = variables.get(var.group(1))
        if variable is None or variable.get("type") != "datasource":
            return [f"datasource variable {uid} is not defined as a datasource variable"]
        if variable.get("query") != ref.get("type"):
            return [f"datasource variable {uid} lists {variable.get('query')} sources, the panel wants {ref.get('type')}"]
        uid = variable.get("current", {}).get("value")
    if uid not in datasources:
        return [f"datasource uid {uid!r} is not provisioned (provisioned: {sorted(datasources)})"]
    if datasources[uid] != ref.get("type"):
        return [f"datasource {uid} is a {datasources[uid]}, the panel says {ref.get('type')}"]
    return []


def dashboard_queries(dashboard_file: Path) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query, for syntax checks with promtool."""
    dash = json.loads(dashboard_file.read_text())
    return [
        (p.get("title", ""), t["expr"])
        for p in _panels(dash)
        for t in p.get("targets", [])
        if "expr" in t
    ]


# ---- Kubernetes -----------------------------------------------------------------------------


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every resource of every YAML file."""
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization_problems(k8s_dir: Path) -> list[str]:
    """Resources and generator files the kustomization names that are missing, and manifests it forgets."""
    kustomization = yaml.safe_load((k8s_dir / "kustomization.yaml").read_text())
    listed = kustomization.get("resources", [])
    problems = [f"resource {r} does not exist" for r in listed if not (k8s_dir / r).is_file()]
    generated = [f for gen in kustomization.get("configMapGenerator", []) for f in gen.get("files", [])]
    problems += [f"configMapGenerator file {f} does not exist" for f in generated if not (k8s_dir / f).is_file()]
    manifests = {p.name for p in k8s_dir.glob("*.yaml")} - {"kustomization.yaml"}
    problems += [f"{m} is not listed in kustomization.yaml resources" for m in sorted(manifests - set(listed))]
    return problems


def k8s_reference_problems(resources: list[dict[str, Any]], generated_configmaps: set[str]) -> list[str]:
    """Selectors, port names and ConfigMaps that do not point at anything."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in resources:
        by_kind.setdefault(r["kind"], []).append(r)
    problems: list[str] = []
    pods = [d["spec"]["template"] for d in by_kind.get("Deployment", [])]
    container_ports = {
        p["name"] for pod in pods for c in pod["spec"]["containers"] for p in c.get("ports", []) if "name" in p
    }
    for pod in pods:
        for c in pod["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in container_ports:
                    problems.append(f"{c['name']}: {probe} port {port} is not a container port")
        for volume in pod["spec"].get("volumes", []):
            name = volume.get("configMap", {}).get("name")
            if name is not None and name not in generated_configmaps:
                problems.append(f"volume {volume['name']}: ConfigMap {name} is not generated by the kustomization")
    for dep in by_kind.get("Deployment", []):
        if not _selects(dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"]):
            problems.append(f"Deployment {dep['metadata']['name']}: selector does not match its pod labels")
    for svc in by_kind.get("Service", []):
        name = svc["metadata"]["name"]
        if not any(_selects(svc["spec"]["selector"], pod["metadata"]["labels"]) for pod in pods):
            problems.append(f"Service {name}: selector matches no pod")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if isinstance(target, str) and target not in container_ports:
                problems.append(f"Service {name}: targetPort {target} is not a container port")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not any(_selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]) for pod in pods):
            problems.append(f"PodDisruptionBudget {pdb['metadata']['name']}: selector matches no pod")
    for monitor in by_kind.get("ServiceMonitor", []):
        selector = monitor["spec"]["selector"]["matchLabels"]
        services = [s for s in by_kind.get("Service", []) if _selects(selector, s["metadata"].get("labels", {}))]
        if not services:
            problems.append(f"ServiceMonitor {monitor['metadata']['name']}: selector matches no Service")
        ports = {p.get("name") for s in services for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint.get("port") not in ports:
                problems.append(
                    f"ServiceMonitor {monitor['metadata']['name']}: port {endpoint.get('port')} is on no selected Service"
                )
    return problems


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())

