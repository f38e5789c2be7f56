"""Does each co-located group hold both copies of the weights in its servers' memory shares?

A group's EAGLE server and plain server each hold a full copy of the model (the EAGLE one also the
draft) inside its `mem_fraction_static` share of the group's GPUs. When the sizes are known
(`[launch]` keys for SGLang, the profile for the simulator), a group whose copy does not fit is
refused before anything starts, with how many groups the node can hold instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from backends.config import LaunchConfig
from backends.memory import ModelMemory, kv_budget_gb
from backends.resolve import EAGLE, PLAIN, PlanError, ResolvedGroup, ResolvedServer, load_launch_profile


def check_launch_memory(launch: LaunchConfig, groups: Sequence[ResolvedGroup]) -> None:
    """Refuse (PlanError) a co-located group that cannot hold both copies; silent when the sizes are unknown.

    The sizes are the `[launch]` keys for SGLang and the profile's for the simulator, whose servers
    run on the profile's GPU count when a group lists no GPUs.
    """
    if not any(g.colocated for g in groups):
        return
    known = launch_memory(launch)
    if known is not None:
        check_group_memory(groups, *known)


def launch_memory(launch: LaunchConfig) -> tuple[ModelMemory, int | None] | None:
    """The model's sizes and the GPU count of a group that lists none (None: unknown); None without the sizes."""
    if launch.engine == "sim":
        profile = load_launch_profile(launch)
        return profile.memory, profile.num_gpus
    if launch.gpu_memory_gb is None or launch.target_weights_gb is None:
        return None
    return ModelMemory(launch.gpu_memory_gb, launch.target_weights_gb, launch.draft_weights_gb or 0.0), None


def check_group_memory(groups: Sequence[ResolvedGroup], memory: ModelMemory, unlisted_gpus: int | None) -> None:
    """Raise PlanError for the first co-located group with a server whose share does not hold its weights.

    `unlisted_gpus`: the GPU count of a group that lists none (the simulator's profile knows it;
    for SGLang it is unknown and such a group is not checked).
    """
    colocated = [g for g in groups if g.colocated]
    sizes = [len(g.gpus) or unlisted_gpus for g in colocated]
    node_gpus = sum(n for n in sizes if n is not None)
    for group, gpus in zip(colocated, sizes, strict=True):
        if gpus is None:
            continue
        for server in group.servers:
            if kv_budget_gb(memory, gpus, _share(server), speculative=server.role == EAGLE) <= 0:
                raise PlanError(_refusal(group, gpus, server, memory, node_gpus))


def _share(server: ResolvedServer) -> float:
    assert server.mem_share is not None, "co-located servers always have a memory share"
    return server.mem_share


def min_group_gpus(memory: ModelMemory, eagle_share: float, plain_share: float) -> int:
    """The fewest GPUs a group needs so that both servers' shares hold their weights with room left."""
    need = max(
        memory.weights_gb(speculative=True) / (eagle_share * memory.gpu_memory_gb),
        memory.weights_gb(speculative=False) / (plain_share * memory.gpu_memory_gb),
    )
    # Strictly more than the weights: a share that only just holds them leaves no KV cache.
    return math.floor(need) + 1


def _refusal(group: ResolvedGroup, gpus: int, server: ResolvedServer, memory: ModelMemory, node_gpus: int) -> str:
    share = _share(server)
    speculative = server.role == EAGLE
    weights = f"{memory.target_weights_gb:g} GB"
    if speculative and memory.draft_weights_gb:
        weights = f"{memory.target_weights_gb:g} + {memory.draft_weights_gb:g} GB (target + draft)"
    shares = {s.role: _share(s) for s in group.servers}
    need = min_group_gpus(memory, shares[EAGLE], shares[PLAIN])
    # Equal groups that tile the node: the smallest divisor of its GPU count that is large enough.
    size = next((n for n in range(need, node_gpus + 1) if node_gpus % n == 0), None)
    capacity = (
        f"with these shares a group needs at least {need} GPUs, so the node's {node_gpus} GPUs hold "
        f"{node_gpus // size} group(s) of {size} (launch.group_size = {size})"
        if size is not None
        else f"even all {node_gpus} GPU(s) in one group do not hold both copies with these shares"
    )
    where = f"GPUs {list(group.gpus)}" if group.gpus else f"{gpus} GPU(s)"
    return (
        f"group {group.name} ({where}) cannot hold both servers: the {server.role} server's "
        f"mem_fraction_static share {share:g} of {gpus} x {memory.gpu_memory_gb:g} GB is "
        f"{share * gpus * memory.gpu_memory_gb:.1f} GB, not more than its weights {weights}; {capacity}. "
        'Use larger groups, other launch.eagle/launch.plain mem_fraction_static shares, or topology = "partitioned"'
    )
