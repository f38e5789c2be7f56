"""The launch plan: which OS processes specgate starts for its backends, exactly.

`build_plan` turns the `[launch]` table into processes (argv + environment, and which process
each waits for before it starts) and the endpoints the gateway routes to, group by group. It
fills in the derived defaults, refuses groups whose memory cannot hold both servers (when the
sizes are known), and collects warnings about setups that start but are probably wrong. Nothing
here starts anything; `backends.supervisor` runs a plan and `specgate plan` prints one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from backends.config import LaunchConfig
from backends.plan_checks import check_launch
from backends.plan_memory import check_launch_memory
from backends.resolve import (
    COLOCATED,
    EAGLE,
    GROUPS,
    PLAIN,
    PlanError,
    ResolvedGroup,
    ResolvedServer,
    free_loopback_port,
    resolve_groups,
)
from backends.sglang_args import backend_api_key, sglang_argv, sglang_server_args
from backends.sim_argv import SimCommon, SimGroups, SimServer, sim_argv

__all__ = [
    "COLOCATED",
    "EAGLE",
    "GROUPS",
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
    # Start only once this process (by name) is ready: co-located SGLang servers size their memory
    # from what is free on the GPUs when they start, so the two of a group must not load at once.
    start_after: str | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """The processes to run and what looked wrong while planning them.

    Processes start in parallel except where one names another in `start_after`.
    """

    processes: tuple[ProcessSpec, ...]
    warnings: tuple[str, ...]

    def __post_init__(self) -> None:
        # Only an earlier process may be waited for, so no start order can wait on itself.
        seen: set[str] = set()
        for process in self.processes:
            if process.start_after is not None and process.start_after not in seen:
                raise ValueError(f"process {process.name} starts after {process.start_after!r}, not an earlier process")
            seen.add(process.name)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """Every endpoint of every process."""
        return tuple(e for p in self.processes for e in p.endpoints)

    @property
    def sequential(self) -> bool:
        """Whether some process waits for another to be ready before it starts."""
        return any(p.start_after is not None for p in self.processes)


def build_plan(
    launch: LaunchConfig, *, eagle_cap: int, free_port: Callable[[], int] = free_loopback_port
) -> LaunchPlan:
    """The processes that run the `[launch]` table; `eagle_cap` is the policy's EAGLE limit."""
    groups = resolve_groups(launch, eagle_cap=eagle_cap, free_port=free_port)
    check_launch_memory(launch, groups)
    servers = tuple(s for g in groups for s in g.servers)
    warnings = tuple(check_launch(launch, servers, eagle_cap=eagle_cap))
    if launch.engine == "sim":
        return LaunchPlan(processes=_sim_processes(launch, groups), warnings=warnings)
    processes = tuple(p for g in groups for p in _sglang_group(launch, g))
    return LaunchPlan(processes=processes, warnings=warnings)


def _sglang_group(launch: LaunchConfig, group: ResolvedGroup) -> list[ProcessSpec]:
    """One process per server; in a co-located group each starts once the one before it is ready."""
    processes: list[ProcessSpec] = []
    for server in group.servers:
        after = processes[-1].name if processes else None
        processes.append(_sglang_process(launch, server, start_after=after))
    return processes


def _sglang_process(launch: LaunchConfig, server: ResolvedServer, *, start_after: str | None) -> ProcessSpec:
    args = sglang_server_args(launch, server)
    env = dict(server.env)
    if server.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in server.gpus)
    # SGLang's served name defaults to the model path; the gateway needs to know it either way.
    endpoint = Endpoint(
        backend=server.name,
        url=server.url,
        speculative=args.speculative is not None,
        served_model_name=launch.served_model_name or launch.model_path,
        group=server.group,
    )
    return ProcessSpec(
        name=server.name,
        argv=sglang_argv(launch.python, args),
        env=env,
        endpoints=(endpoint,),
        start_after=start_after,
    )


def _sim_processes(launch: LaunchConfig, groups: tuple[ResolvedGroup, ...]) -> tuple[ProcessSpec, ...]:
    # SimCommon's fields are the `[launch]` keys of the same names, plus the backend key.
    launch_keys = ("profile", "profile_file", "time_scale", "seed", "startup_delay", "served_model_name")
    common = SimCommon(**{key: getattr(launch, key) for key in launch_keys}, api_key=backend_api_key(launch))
    if launch.topology != GROUPS and not any(g.colocated for g in groups):
        return tuple(
            ProcessSpec(
                name=s.name,
                argv=sim_argv(common, _sim_server(s), s.extra_args),
                env=dict(s.env),
                endpoints=(_sim_endpoint(launch, s),),
            )
            for g in groups
            for s in g.servers
        )
    # One process serves every group (CPU is what the simulator is short of, not GPUs).
    def servers(role: str, colocated: bool) -> list[ResolvedServer]:
        return [s for g in groups if g.colocated == colocated for s in g.servers if s.role == role]

    eagles, plains = servers(EAGLE, True), servers(PLAIN, True)
    # The templates' values, the same in every group; the memory split only where two servers share.
    eagle, plain = (eagles + servers(EAGLE, False))[0], (plains + servers(PLAIN, False))[0]
    placement = SimGroups(
        host=eagle.host,
        eagle_ports=tuple(s.port for s in eagles),
        plain_ports=tuple(s.port for s in plains),
        eagle_only_ports=tuple(s.port for s in servers(EAGLE, False)),
        plain_only_ports=tuple(s.port for s in servers(PLAIN, False)),
        eagle_mem_fraction=eagles[0].mem_share if eagles else None,
        plain_mem_fraction=plains[0].mem_share if plains else None,
        gpus_per_group=_sim_group_size(groups),
        eagle_max_running_requests=eagle.max_running_requests,
        plain_max_running_requests=plain.max_running_requests,
    )
    return (
        ProcessSpec(
            name=launch.topology,
            argv=sim_argv(common, placement, (*eagle.extra_args, *plain.extra_args)),
            env={**eagle.env, **plain.env},
            endpoints=tuple(_sim_endpoint(launch, s) for g in groups for s in g.servers),
        ),
    )


def _sim_server(server: ResolvedServer) -> SimServer:
    return SimServer(
        role=server.role,
        host=server.host,
        port=server.port,
        max_running_requests=server.max_running_requests,
        metric_labels={"pool": server.role},
    )


def _sim_endpoint(launch: LaunchConfig, server: ResolvedServer) -> Endpoint:
    return Endpoint(
        backend=server.name,
        url=server.url,
        speculative=server.role == EAGLE,
        served_model_name=launch.served_model_name,
        group=server.group,
    )


def _sim_group_size(groups: tuple[ResolvedGroup, ...]) -> int | None:
    """The simulator's `--gpus-per-group`: the groups' common size (None when no GPUs are listed)."""
    sizes = {len(g.gpus) for g in groups}
    if sizes == {0}:
        return None
    if len(sizes) > 1:
        raise PlanError(
            f"launch.groups: the simulator runs groups of one size, got sizes {sorted(sizes)}; "
            "give every group as many GPUs"
        )
    return sizes.pop()


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
