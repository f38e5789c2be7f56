"""GPU memory of a server group: does a second copy of the weights fit, and what KV room is left.

A group is a set of GPUs running an EAGLE-3 server and a plain server co-located. SGLang gives each
server `mem_fraction_static` of the GPU memory for its weights and its KV cache (the rest is
activations and CUDA graphs), so each copy of the weights costs KV room. Sizes are whole-model
gigabytes (tensor parallelism splits them over the group's GPUs).

KV per token: a profile's `max_total_tokens` is what a server alone on its GPUs holds at the
profile's lone-server fraction, so its KV bytes per token are that server's KV budget divided by
those tokens (`kv_bytes_per_token`), and any other placement holds its own budget divided by the
same bytes (`kv_tokens`). A server placed exactly as the profile was measured keeps its tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class ModelMemory:
    """What one server of a model holds in GPU memory besides its KV cache."""

    gpu_memory_gb: float  # each GPU's memory
    target_weights_gb: float  # the served model, whole (split over the TP group)
    draft_weights_gb: float = 0.0  # the EAGLE-3 draft model, whole; only the speculative server holds it

    def weights_gb(self, speculative: bool) -> float:
        """Weights one server holds: the target, plus the draft for the speculative server."""
        return self.target_weights_gb + (self.draft_weights_gb if speculative else 0.0)


@dataclass(frozen=True)
class ServerShare:
    """One server on a group's GPUs: its name (for messages), its share of their memory, and its draft."""

    name: str
    fraction: float
    speculative: bool


def kv_budget_gb(memory: ModelMemory, gpus: int, fraction: float, *, speculative: bool) -> float:
    """KV cache room of one server given `fraction` of `gpus` GPUs' memory; negative when its weights do not fit."""
    return fraction * gpus * memory.gpu_memory_gb - memory.weights_gb(speculative)


def kv_bytes_per_token(reference_budget_gb: float, reference_tokens: int) -> float:
    """KV bytes one token costs, from a server whose `reference_budget_gb` holds `reference_tokens`."""
    if reference_budget_gb <= 0 or reference_tokens < 1:
        raise ValueError(f"a reference needs KV room and tokens, got {reference_budget_gb} GB for {reference_tokens}")
    return reference_budget_gb * _BYTES_PER_GB / reference_tokens


def kv_tokens(budget_gb: float, bytes_per_token: float) -> int:
    """Tokens a KV budget holds (0 when there is no room)."""
    # The tolerance keeps a budget equal to the reference's at exactly the reference's tokens.
    return max(0, math.floor(budget_gb * _BYTES_PER_GB / bytes_per_token + 1e-6))


def group_misfit(memory: ModelMemory, gpus: int, servers: Sequence[ServerShare]) -> str | None:
    """Why a group of `gpus` GPUs cannot hold `servers` at their shares; None when every one fits."""
    total = sum(server.fraction for server in servers)
    if total >= 1.0:
        shares = ", ".join(f"{server.name} {server.fraction:g}" for server in servers)
        return f"the memory shares add up to {total:.2f} of the GPUs ({shares}); they must stay below 1"
    whole = gpus * memory.gpu_memory_gb
    for server in servers:
        weights = memory.weights_gb(server.speculative)
        if kv_budget_gb(memory, gpus, server.fraction, speculative=server.speculative) <= 0:
            return (
                f"the {server.name} server's weights ({weights:g} GB) do not fit in its share {server.fraction:g} "
                f"of {gpus} x {memory.gpu_memory_gb:g} GB ({server.fraction * whole:g} GB), leaving no KV cache"
            )
    return None


def smallest_group(memory: ModelMemory, node_gpus: int, servers: Sequence[ServerShare]) -> int | None:
    """Fewest GPUs, dividing the node evenly, of a group that holds `servers`; None if not even the whole node does."""
    for gpus in range(1, node_gpus + 1):
        if node_gpus % gpus == 0 and group_misfit(memory, gpus, servers) is None:
            return gpus
    return None


def max_groups(memory: ModelMemory, node_gpus: int, servers: Sequence[ServerShare]) -> int:
    """How many equal groups, each holding `servers`, a node of `node_gpus` GPUs can run (0: none)."""
    gpus = smallest_group(memory, node_gpus, servers)
    return node_gpus // gpus if gpus else 0


def node_capacity(memory: ModelMemory, node_gpus: int, servers: Sequence[ServerShare], noun: str = "group") -> str:
    """A sentence saying how many groups (or other `noun`s) of `servers` a node can hold, for refusals."""
    gpus = smallest_group(memory, node_gpus, servers)
    if gpus is None:
        return f"a node of {node_gpus} GPUs cannot hold even one such {noun} at these shares"
    groups = node_gpus // gpus
    return (
        f"a node of {node_gpus} GPUs can hold {groups} such {noun}{'s' if groups != 1 else ''} "
        f"of {gpus} GPU{'s' if gpus != 1 else ''} at these shares"
    )
