"""The launch plan: which OS processes specgate starts for its two backends, exactly.

`build_plan` turns the `[launch]` table into processes (argv + environment) and the endpoints
the gateway routes to, fills in the derived defaults, and collects warnings about setups that
start but are probably wrong. Nothing here starts anything; `backends.supervisor` runs a plan and
`specgate plan` prints one.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from backends.config import LaunchConfig
from backends.plan_checks import check_launch
from backends.resolve import (
    COLOCATED,
    EAGLE,
    PLAIN,
    PlanError,
    ResolvedServer,
    free_loopback_port,
    resolve_servers,
)
from backends.sglang_args import backend_api_key, metric_labels_json, sglang_argv, sglang_server_args

__all__ = [
    "COLOCATED",
    "EAGLE",
    "PLAIN",
    "Endpoint",
    "LaunchPlan",
    "PlanError",
    "ProcessSpec",
    "build_plan",
    "free_loopback_port",
    "redact_argv",
    "redact_env",
]

_SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
REDACTED = "***"


@dataclass(frozen=True)
class Endpoint:
    """One backend the gateway routes to."""

    backend: str
    url: str
    speculative: bool
    served_model_name: str | None
    # Backends of one group share GPUs (their steps take turns); partitioned servers are groups of one.
    group: str


@dataclass(frozen=True)
class ProcessSpec:
    """One OS process to supervise."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]  # only what is set on top of the inherited environment
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class LaunchPlan:
    """The processes to run, in start order, and what looked wrong while planning them."""

    processes: tuple[ProcessSpec, ...]
    warnings: tuple[str, ...]
    # Start each process only once the previous one is ready: colocated SGLang servers size their
    # memory from what is free on the GPU when they start, so they must not load at the same time.
    sequential: bool = False

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """Every endpoint of every process."""
        return tuple(e for p in self.processes for e in p.endpoints)


def build_plan(
    launch: LaunchConfig, *, eagle_cap: int, free_port: Callable[[], int] = free_loopback_port
) -> LaunchPlan:
    """The processes that run the `[launch]` table; `eagle_cap` is the policy's EAGLE limit."""
    servers = resolve_servers(launch, eagle_cap=eagle_cap, free_port=free_port)
    warnings = tuple(check_launch(launch, servers, eagle_cap=eagle_cap))
    if launch.engine == "sim":
        return LaunchPlan(processes=_sim_processes(launch, servers), warnings=warnings)
    processes = tuple(_sglang_process(launch, servers[role]) for role in (EAGLE, PLAIN))
    return LaunchPlan(processes=processes, warnings=warnings, sequential=launch.topology == COLOCATED)


def _sglang_process(launch: LaunchConfig, server: ResolvedServer) -> ProcessSpec:
    args = sglang_server_args(launch, server)
    env = dict(server.env)
    if server.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in server.gpus)
    # SGLang's served name defaults to the model path; the gateway needs to know it either way.
    endpoint = Endpoint(
        backend=server.role,
        url=server.url,
        speculative=args.speculative is not None,
        served_model_name=launch.served_model_name or launch.model_path,
        group=_group_of(launch, server.role),
    )
    return ProcessSpec(name=server.role, argv=sglang_argv(launch.python, args), env=env, endpoints=(endpoint,))


def _sim_processes(launch: LaunchConfig, servers: dict[str, ResolvedServer]) -> tuple[ProcessSpec, ...]:
    eagle, plain = servers[EAGLE], servers[PLAIN]
    endpoints = {
        role: Endpoint(
            backend=role,
            url=s.url,
            speculative=role == EAGLE,
            served_model_name=launch.served_model_name,
            group=_group_of(launch, role),
        )
        for role, s in servers.items()
    }
    if launch.topology == COLOCATED:
        placement: tuple[str, ...] = (
            "--colocated",
            "--host",
            eagle.host,
            "--eagle-port",
            str(eagle.port),
            "--plain-port",
            str(plain.port),
        )
        limits = tuple(
            arg
            for server in (eagle, plain)
            if server.max_running_requests
            for arg in (f"--{server.role}-max-running-requests", str(server.max_running_requests))
        )
        argv = (*_sim_argv(launch, placement), *limits, *eagle.extra_args, *plain.extra_args)
        env = {**eagle.env, **plain.env}
        return (ProcessSpec(name=COLOCATED, argv=argv, env=env, endpoints=(endpoints[EAGLE], endpoints[PLAIN])),)
    processes = []
    for server in (eagle, plain):
        placement = ("--role", server.role, "--host", server.host, "--port", str(server.port))
        limit = ("--max-running-requests", str(server.max_running_requests)) if server.max_running_requests else ()
        labels = ("--extra-metric-labels", metric_labels_json({"pool": server.role}))
        argv = (*_sim_argv(launch, placement), *limit, *labels, *server.extra_args)
        processes.append(
            ProcessSpec(name=server.role, argv=argv, env=dict(server.env), endpoints=(endpoints[server.role],))
        )
    return tuple(processes)


def _group_of(launch: LaunchConfig, role: str) -> str:
    """Co-located servers form one group ("g0"); a partitioned server is a group of its own."""
    return "g0" if launch.topology == COLOCATED else role


def _sim_argv(launch: LaunchConfig, placement: tuple[str, ...]) -> tuple[str, ...]:
    argv: list[str] = [sys.executable, "-m", "backends.sim", *placement, "--profile", launch.profile]
    if launch.profile_file is not None:
        argv += ["--profile-file", str(launch.profile_file)]
    argv += ["--time-scale", f"{launch.time_scale:g}", "--seed", str(launch.seed)]
    if launch.startup_delay:
        argv += ["--startup-delay", f"{launch.startup_delay:g}"]
    if launch.served_model_name is not None:
        argv += ["--served-model-name", launch.served_model_name]
    api_key = backend_api_key(launch)
    if api_key is not None:
        argv += ["--api-key", api_key]
    argv.append("--enable-metrics")
    return tuple(argv)


def redact_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """`argv` with API keys replaced, for logs and `specgate plan` (the real argv keeps them)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if hide_next:
            out.append(REDACTED)
        elif eq and name in _SECRET_FLAGS:
            out.append(f"{name}={REDACTED}")
        else:
            out.append(arg)
        hide_next = not eq and arg in _SECRET_FLAGS
    return tuple(out)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with values of secret-looking names (…KEY, …TOKEN, …) replaced."""
    return {k: (REDACTED if _SECRET_ENV.search(k) else v) for k, v in env.items()}
