"""The command line of a simulator process (`python -m backends.sim`), built in one place.

A simulator process runs either one server (`--role`, one port) or K co-located groups
(`--colocated`, an EAGLE and a plain port per group, and a port per plain-only group, one process
for all of them since CPU is scarce). The launch plan and the load test's envelope both start simulators; both build their
argv here so the flags stay the simulator's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from backends.sglang_args import CACHE_REPORT_FLAG, metric_labels_json


@dataclass(frozen=True)
class SimCommon:
    """Flags every simulator process takes, whatever it serves."""

    profile: str | None  # None: the simulator's default profile
    profile_file: Path | None = None
    time_scale: float = 1.0
    seed: int = 0
    startup_delay: float = 0.0
    served_model_name: str | None = None
    api_key: str | None = None


@dataclass(frozen=True)
class SimServer:
    """One simulated server: a role ("eagle", "plain" or "adaptive") on one port."""

    role: str
    host: str
    port: int
    max_running_requests: int | None = None
    metric_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SimGroups:
    """K co-located groups in one process: group i serves EAGLE on eagle_ports[i], plain on plain_ports[i];
    then one EAGLE-only group per port of eagle_only_ports and one plain-only group per port of
    plain_only_ports (a server alone on its group's GPUs)."""

    host: str
    eagle_ports: tuple[int, ...]
    plain_ports: tuple[int, ...]
    plain_only_ports: tuple[int, ...] = ()
    eagle_only_ports: tuple[int, ...] = ()
    eagle_mem_fraction: float | None = None  # each server's share of its group's GPU memory
    plain_mem_fraction: float | None = None
    gpus_per_group: int | None = None  # None: the profile's GPU count
    eagle_max_running_requests: int | None = None
    plain_max_running_requests: int | None = None


def sim_argv(common: SimCommon, placement: SimServer | SimGroups, extra_args: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The full argv of one simulator process (metrics and cached-token reports on), `extra_args` last."""
    argv: list[str] = [sys.executable, "-m", "backends.sim", *_placement(placement)]
    if common.profile is not None:
        argv += ["--profile", common.profile]
    if common.profile_file is not None:
        argv += ["--profile-file", str(common.profile_file)]
    argv += ["--time-scale", f"{common.time_scale:g}", "--seed", str(common.seed)]
    if common.startup_delay:
        argv += ["--startup-delay", f"{common.startup_delay:g}"]
    if common.served_model_name is not None:
        argv += ["--served-model-name", common.served_model_name]
    if common.api_key is not None:
        argv += ["--api-key", common.api_key]
    argv += ["--enable-metrics", CACHE_REPORT_FLAG]  # as the launcher's SGLang servers
    argv += _limits(placement)
    return (*argv, *extra_args)


def _placement(placement: SimServer | SimGroups) -> list[str]:
    if isinstance(placement, SimServer):
        return ["--role", placement.role, "--host", placement.host, "--port", str(placement.port)]
    if len(placement.eagle_ports) != len(placement.plain_ports):
        raise ValueError(
            f"one EAGLE and one plain port per group, got {placement.eagle_ports} and {placement.plain_ports}"
        )
    if not (placement.eagle_ports or placement.eagle_only_ports) or not (placement.plain_ports or placement.plain_only_ports):
        raise ValueError("the groups must run an EAGLE and a plain server between them")
    out = ["--colocated", "--host", placement.host]
    out += [arg for port in placement.eagle_ports for arg in ("--eagle-port", str(port))]
    out += [arg for port in placement.plain_ports for arg in ("--plain-port", str(port))]
    out += [arg for port in placement.eagle_only_ports for arg in ("--eagle-only-port", str(port))]
    out += [arg for port in placement.plain_only_ports for arg in ("--plain-only-port", str(port))]
    for flag, value in (
        ("--eagle-mem-fraction", placement.eagle_mem_fraction),
        ("--plain-mem-fraction", placement.plain_mem_fraction),
    ):
        if value is not None:
            out += [flag, f"{value:g}"]
    if placement.gpus_per_group is not None:
        out += ["--gpus-per-group", str(placement.gpus_per_group)]
    return out


def _limits(placement: SimServer | SimGroups) -> list[str]:
    if isinstance(placement, SimServer):
        out = ["--max-running-requests", str(placement.max_running_requests)] if placement.max_running_requests else []
        if placement.metric_labels:
            out += ["--extra-metric-labels", metric_labels_json(placement.metric_labels)]
        return out
    return [
        arg
        for flag, value in (
            ("--eagle-max-running-requests", placement.eagle_max_running_requests),
            ("--plain-max-running-requests", placement.plain_max_running_requests),
        )
        if value
        for arg in (flag, str(value))
    ]
