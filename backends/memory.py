"""GPU memory of a server group: does a second copy of the weights fit, and what KV room is left.

A group is a set of GPUs running an EAGLE-3 server and a plain server co-located. SGLang gives each
server `mem_fraction_static` of the GPU memory for its weights and its KV cache (the rest is
activations and CUDA graphs), so each copy of the weights costs KV room. Sizes are whole-model
gigabytes (tensor parallelism splits them over the group's GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelMemory:
    """What one server of a model holds in GPU memory besides its KV cache."""

    gpu_memory_gb: float  # each GPU's memory
    target_weights_gb: float  # the served model, whole (split over the TP group)
    draft_weights_gb: float = 0.0  # the EAGLE-3 draft model, whole; only the speculative server holds it

    def weights_gb(self, speculative: bool) -> float:
        """Weights one server holds: the target, plus the draft for the speculative server."""
        return self.target_weights_gb + (self.draft_weights_gb if speculative else 0.0)


def kv_budget_gb(memory: ModelMemory, gpus: int, fraction: float, *, speculative: bool) -> float:
    """KV cache room of one server given `fraction` of `gpus` GPUs' memory; negative when its weights do not fit."""
    return fraction * gpus * memory.gpu_memory_gb - memory.weights_gb(speculative)
