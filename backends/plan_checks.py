"""Warnings about launch setups that start but are probably not what the operator meant.

Each check is one small function over the config and the resolved servers (every server of every
group), returning the warnings it found as sentences that name the config key to change. In
topology "groups" the `eagle`/`plain` tables are templates, so a warning about a template is
given once, not once per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from backends.config import LaunchConfig
from backends.memory import kv_budget_gb
from backends.plan_memory import launch_memory
from backends.resolve import COLOCATED, EAGLE, GROUPS, PLAIN, ResolvedServer, longest_request_kv_gb, shares_gpus
from backends.sglang_args import (
    DEPRECATED_FLAGS,
    PARALLEL_FLAGS,
    REMOVED_FLAGS,
    flag_value,
    flags_in,
    sglang_argv,
    sglang_server_args,
)

# Above this, two colocated servers leave too little memory for activations and CUDA graphs.
COLOCATED_MEM_WARN = 0.9

# Algorithms that speculate with a separate draft checkpoint (NEXTN/MTP use the model's own layers).
_NEEDS_DRAFT = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
_EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN"})

Servers = tuple[ResolvedServer, ...]


def check_launch(launch: LaunchConfig, servers: Servers, *, eagle_cap: int) -> list[str]:
    """Every warning for this launch configuration, most important first."""
    checks: list[Callable[[LaunchConfig, Servers, int], Iterator[str]]] = [_longest_request, _ports]
    if launch.engine == "sglang":
        checks = [_model, _speculative, _gpus, _parallel, _memory, _eagle_limits, _extra_args, *checks]
    return list(dict.fromkeys(w for check in checks for w in check(launch, servers, eagle_cap)))


def _by_role(servers: Servers) -> dict[str, ResolvedServer]:
    """The first server of each role: the only one outside topology "groups", a template's values in it."""
    out: dict[str, ResolvedServer] = {}
    for server in servers:
        out.setdefault(server.role, server)
    return out


def _key(server: ResolvedServer) -> str:
    """How a warning names a server: its config table, and its group when there are several."""
    return f"launch.{server.role}" if server.name == server.role else f"launch.{server.role} ({server.name})"


def _model(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    if launch.model_path is None:
        yield "launch.model_path is not set: SGLang cannot start without --model-path"


def _speculative(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    algorithm = launch.speculative_algorithm
    if algorithm in _NEEDS_DRAFT and launch.draft_model_path is None:
        yield f"launch.draft_model_path is not set: the EAGLE backend ({algorithm}) needs a draft model"
    if algorithm in _EAGLE_FAMILY and launch.eagle_topk == 1 and launch.num_draft_tokens != launch.num_steps + 1:
        yield (
            f"with eagle_topk = 1 SGLang replaces num_draft_tokens = {launch.num_draft_tokens} by "
            f"num_steps + 1 = {launch.num_steps + 1}; set it to that to run what you configured"
        )


def _gpus(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    if launch.topology == GROUPS:  # the config already refused overlapping or empty groups
        return
    eagle, plain = _by_role(servers)[EAGLE].gpus, _by_role(servers)[PLAIN].gpus
    if launch.topology == COLOCATED:
        if launch.eagle.gpus and launch.plain.gpus and set(launch.eagle.gpus) != set(launch.plain.gpus):
            yield (
                f"colocated servers should share the same GPUs, got eagle {list(eagle)} and plain "
                f'{list(plain)}; use topology = "partitioned" to split them'
            )
        if not eagle:
            yield "no GPUs configured: both colocated servers use every GPU the node shows them"
        return
    overlap = sorted(set(eagle) & set(plain))
    if overlap:
        yield (
            f"partitioned servers share GPUs {overlap} (eagle {list(eagle)}, plain {list(plain)}); "
            'give each its own GPUs or use topology = "colocated"'
        )
    for server in servers:
        if not server.gpus:
            yield (
                f"launch.{server.role}.gpus is empty: in partitioned mode the {server.role} server "
                "would see every GPU of the node"
            )


def _parallel(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    for server in servers:
        if not server.gpus or server.tp_size is None:
            continue
        degrees = {name: int(flag_value(server.extra_args, flags) or 1) for name, flags in PARALLEL_FLAGS.items()}
        per_replica = server.tp_size * degrees["pp"]
        used = per_replica * degrees["dp"]
        count = len(server.gpus)
        if count % server.tp_size:
            yield f"{_key(server)}: tp_size {server.tp_size} does not divide its {count} GPUs {list(server.gpus)}"
        elif used > count:
            yield f"{_key(server)}: needs {used} GPUs (tp x pp x dp) but has {count} {list(server.gpus)}"
        elif used < count:
            yield (
                f"{_key(server)}: uses {used} of its {count} GPUs (tp_size {server.tp_size}); "
                f"the other {count - used} stay idle unless you add --dp-size {count // per_replica} to extra_args"
            )


def _memory(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    if not shares_gpus(launch):
        return
    eagle, plain = _by_role(servers)[EAGLE].mem_share or 0.0, _by_role(servers)[PLAIN].mem_share or 0.0
    if eagle + plain > COLOCATED_MEM_WARN:
        yield (
            f"colocated mem_fraction_static shares add up to {eagle + plain:.2f} "
            f"(eagle {eagle}, plain {plain}): over {COLOCATED_MEM_WARN} leaves the two servers too "
            "little memory for activations and CUDA graphs"
        )


def _longest_request(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    """Where every server shares its GPUs and none holds the longest request, SGLang refuses it (400)."""
    floor, known = longest_request_kv_gb(launch), launch_memory(launch)
    if floor <= 0.0 or known is None or any(s.mem_share is None for s in servers):
        return  # a server alone on its GPUs (SGLang's own memory default) holds what plain DP holds
    memory, unlisted = known
    rooms = []
    for server in servers:
        gpus = len(server.gpus) or unlisted
        if gpus is None:
            return
        assert server.mem_share is not None
        rooms.append(kv_budget_gb(memory, gpus, server.mem_share, speculative=server.role == EAGLE))
    if max(rooms) < floor:
        tokens = launch.longest_request_tokens or "the context length"
        yield (
            f"no server holds a request of {tokens} tokens (launch.longest_request_tokens): the largest KV room is "
            f"{max(rooms):.1f} GB of the {floor:.1f} GB it needs, so SGLang refuses it where one server alone on "
            "the same GPUs would serve it; leave the mem_fraction_static shares to the default split, raise "
            "launch.plain.mem_fraction_static, or add a plain-only group"
        )


def _eagle_limits(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    eagle = _by_role(servers)[EAGLE]
    if eagle.max_running_requests is not None and eagle.max_running_requests < eagle_cap:
        yield (
            f"launch.eagle.max_running_requests = {eagle.max_running_requests} is below the routing "
            f"policy's EAGLE cap {eagle_cap}: the excess requests queue inside SGLang"
        )
    for server in servers:
        limit, graph = server.max_running_requests, server.cuda_graph_max_bs_decode
        if limit is not None and graph is not None and graph < limit:
            yield (
                f"launch.{server.role}.cuda_graph_max_bs_decode = {graph} is below its max_running_requests "
                f"= {limit}: batches above {graph} decode without CUDA graphs (slow)"
            )


def _extra_args(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    for server in servers:
        planned = replace(sglang_server_args(launch, server), extra_args=())
        own = set(flags_in(sglang_argv(launch.python, planned)))
        for flag in flags_in(server.extra_args):
            reason = REMOVED_FLAGS.get(flag) or DEPRECATED_FLAGS.get(flag)
            if reason is not None:
                yield f"launch.{server.role}.extra_args: {flag} is {reason}"
            elif flag in own:
                yield f"launch.{server.role}.extra_args: {flag} is also set by the plan; the extra value wins"


def _ports(launch: LaunchConfig, servers: Servers, eagle_cap: int) -> Iterator[str]:
    users: dict[str, list[ResolvedServer]] = {}
    for server in servers:
        users.setdefault(server.url, []).append(server)
    for url, same in users.items():
        if len(same) < 2:
            continue
        names = " and ".join(_key(s) for s in same)
        hint = (
            "; in topology \"groups\" group i uses launch.eagle.port + i and launch.plain.port + i, so keep "
            "the two bases at least the number of groups apart"
            if launch.topology == GROUPS
            else ""
        )
        yield f"{names} {'both' if len(same) == 2 else 'all'} use {url}: give them different ports{hint}"
    eagle, plain = _by_role(servers)[EAGLE], _by_role(servers)[PLAIN]
    if launch.engine == "sim" and shares_gpus(launch) and eagle.host != plain.host:
        yield (f"the colocated simulator is one process on one host: it serves both on {eagle.host}, not {plain.host}")
