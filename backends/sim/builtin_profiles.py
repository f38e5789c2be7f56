"""The built-in calibration profiles' tables (docs/simulator.md says which numbers are measured, which fitted)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

# SGLang's default mem_fraction_static for one server by TP size (its long-standing table:
# 0.88 at TP 1, 0.87 at 2, 0.85 at 4, 0.81 at 8): the share the profiles' KV capacities are taken at.
#
# field-8gpu's model is not named by its source; the memory assumes a Qwen3-235B-A22B-FP8-class MoE
# (about 236 GB of weights, which also suits its 4.5 ms fixed step cost: a dense model of much more
# could not be read in that time) with an EAGLE-3 draft of one decoder layer plus embeddings and a
# 32k-token head (about 2 GB in bf16), on 8 x B200 of 180 GB each (DGX B200: 1,440 GB in all).
# Both servers fit co-located on the 8 GPUs at the default shares; on 4 GPUs the EAGLE server's
# 0.3 share (216 GB) does not hold its weights.
_FIELD_8GPU: dict[str, Any] = {
    "name": "field-8gpu",
    "model_path": "specgate-sim/field-8gpu",
    "accelerator": "NVIDIA B200 (simulated)",
    "num_gpus": 8,
    "context_length": 131072,
    "default_max_tokens": 256,
    "gpu_memory_gb": 180.0,
    "target_weights_gb": 236.0,
    "draft_weights_gb": 2.0,
    "mem_fraction_static": 0.81,
    "node_gpus": 8,
    "plain": {
        "t0_ms": 4.53,
        "per_request_ms": 1.294,
        "tau": 1.0,
        "num_draft_tokens": 1,
        "max_running_requests": 256,
        "prefill_ms_per_token": 0.125,
        "max_total_tokens": 400000,
    },
    "eagle": {
        "t0_ms": 5.82,
        "per_request_ms": 8.47,
        "tau": 3.0,
        "num_draft_tokens": 4,
        "max_running_requests": 48,
        "prefill_ms_per_token": 0.125,
        "max_total_tokens": 200000,
    },
}

# KV capacities are estimates for an 80 GB H100 (16 GB of bf16 weights, 128 KiB of KV per token);
# the EAGLE server loses some to the draft model's weights and KV. Memory: Llama-3.1-8B has 8.03 B
# parameters (16.1 GB in bf16); its EAGLE-3 draft (one decoder layer, the 3-layer fusion and a
# 32k-token head, about 0.43 B parameters) is about 0.9 GB. At SGLang's 0.88 these give 136 KB of KV
# per token for plain and 139 KB for EAGLE (draft KV included), near the real 128 KiB and 132 KiB.
# The node: 8 x H100, one server (or one group) per GPU.
_LLAMA8B_H100: dict[str, Any] = {
    "name": "llama8b-h100",
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "accelerator": "NVIDIA H100 80GB HBM3 (simulated)",
    "num_gpus": 1,
    "context_length": 131072,
    "default_max_tokens": 256,
    "eos_token_id": 128009,
    "gpu_memory_gb": 80.0,
    "target_weights_gb": 16.1,
    "draft_weights_gb": 0.9,
    "mem_fraction_static": 0.88,
    "node_gpus": 8,
    "plain": {
        "t0_ms": 6.27,
        "per_request_ms": 0.045,
        "tau": 1.0,
        "num_draft_tokens": 1,
        "max_running_requests": 256,
        "prefill_ms_per_token": 0.02,
        "max_total_tokens": 400000,
    },
    "eagle": {
        "t0_ms": 10.71,
        "per_request_ms": 0.149,
        "tau": 2.9,
        "num_draft_tokens": 4,
        "max_running_requests": 48,
        "prefill_ms_per_token": 0.02,
        "max_total_tokens": 385000,
    },
}

# Measured on one H200 by `python -m benchmarks.calibrate.gpu` (docs/benchmarks/calibration-h200/).
_H200_LLAMA8B: dict[str, Any] = tomllib.loads(
    (Path(__file__).parent / "measured" / "h200-llama8b.toml").read_text(encoding="utf-8")
)

BUILTIN_TABLES: tuple[dict[str, Any], ...] = (_FIELD_8GPU, _LLAMA8B_H100, _H200_LLAMA8B)
