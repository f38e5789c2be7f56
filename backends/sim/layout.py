"""Which servers one simulator process runs, on which simulated GPUs, and the KV room each one has.

Every group (a co-located pair, or one replica of a role) has `gpus_per_group` GPUs and its own
timeline. Each server takes its share of the group's memory (`SimSettings.mem_share`), holds its
weights there, and keeps the rest as KV cache: its budget divided by the role's KV bytes per token
(`Profile.kv_bytes_per_token`) is its `max_total_tokens`. A lone server on the profile's GPUs keeps
the profile's `max_total_tokens` exactly. A group whose servers do not fit is refused. `engine_core`
builds a slot's engine core the one way every driver of it (real time or virtual) does.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.memory import ServerShare, group_misfit, kv_budget_gb, kv_tokens, node_capacity
from backends.sim.core import EngineCore
from backends.sim.profiles import Profile, Role
from backends.sim.settings import SimSettings
from backends.sim.steps import StepModel
from backends.sim.tokenizer import PseudoText


class LayoutError(ValueError):
    """The servers asked for do not fit their GPUs."""


@dataclass(frozen=True)
class ServerSlot:
    """One simulated server: its role, port, group, and its place in the group's GPU memory."""

    role: Role
    port: int
    group: int  # servers of one group share a simulated GPU timeline
    gpus: int
    mem_share: float  # of the group's whole GPU memory
    weights_gb: float
    kv_budget_gb: float
    kv_bytes_per_token: float
    max_total_tokens: int


def plan_layout(settings: SimSettings, profile: Profile) -> list[ServerSlot]:
    """Every server of the process in start order (group by group); `LayoutError` if a group does not fit."""
    gpus = settings.gpus_per_group or profile.num_gpus
    memory = profile.memory
    slots: list[ServerSlot] = []
    for index, group in enumerate(settings.groups()):
        shares = [
            ServerShare(role, settings.mem_share(role, profile, alone=len(group) == 1), profile.role(role).speculative)
            for role, _ in group
        ]
        problem = group_misfit(memory, gpus, shares)
        if problem is not None:
            noun = "group" if settings.colocated else f"{group[0][0]} server"
            raise LayoutError(
                f"a {noun} of {gpus} GPUs does not fit: {problem}; "
                f"{node_capacity(memory, profile.node_gpus, shares, noun)}"
            )
        for (role, port), share in zip(group, shares, strict=True):
            budget = kv_budget_gb(memory, gpus, share.fraction, speculative=share.speculative)
            per_token = profile.kv_bytes_per_token(role)
            slots.append(
                ServerSlot(
                    role=role,
                    port=port,
                    group=index,
                    gpus=gpus,
                    mem_share=share.fraction,
                    weights_gb=memory.weights_gb(share.speculative),
                    kv_budget_gb=budget,
                    kv_bytes_per_token=per_token,
                    max_total_tokens=kv_tokens(budget, per_token),
                )
            )
    return slots


def engine_core(settings: SimSettings, profile: Profile, slot: ServerSlot, index: int, text: PseudoText) -> EngineCore:
    """The engine core of `slot`, the `index`-th server of the process in start order.

    Its role's table with the slot's KV room and the running cap the settings give, acceptance
    draws seeded `seed * 1000 + index`, the process's output text, its prefix cache unless disabled.
    A drafting server's prefill runs its target model, whose step is the plain role's (`StepModel`).
    """
    table = profile.role(slot.role).model_copy(update={"max_total_tokens": slot.max_total_tokens})
    cap = settings.running_cap(slot.role)
    if cap is not None:
        table = table.model_copy(update={"max_running_requests": cap})
    return EngineCore(
        table,
        StepModel(table, seed=settings.seed * 1000 + index, target=profile.plain if table.speculative else None),
        text,
        max_prefill_tokens=profile.max_prefill_tokens,
        radix_cache=not settings.disable_radix_cache,
        context_length=profile.context_length,
    )
