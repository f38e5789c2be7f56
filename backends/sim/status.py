"""Bodies of SGLang's informational routes: `/v1/models`, `/model_info`, `/server_info`, `/v1/loads`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from backends.sim.endpoint import SGLANG_VERSION, Endpoint
from backends.sim.request import max_req_input_len

LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def model_card(ep: Endpoint, model_id: str) -> dict[str, Any]:
    """One entry of `/v1/models`."""
    return {
        "id": model_id,
        "object": "model",
        "created": int(ep.started_at),
        "owned_by": "sglang",
        "root": model_id,
        "parent": None,
        "max_model_len": ep.profile.context_length,
    }


def model_list(ep: Endpoint) -> dict[str, Any]:
    """`GET /v1/models`."""
    return {"object": "list", "data": [model_card(ep, ep.served_model_name)]}


def model_info(ep: Endpoint) -> dict[str, Any]:
    """`GET /model_info`."""
    return {
        "model_path": ep.profile.model_path,
        "tokenizer_path": ep.profile.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": ep.profile.model_type,
        "architectures": ep.profile.architectures,
    }


def server_info(ep: Endpoint) -> dict[str, Any]:
    """`GET /server_info`: the server arguments SGLang reports, scheduler info and per-rank internal state."""
    table, core = ep.table, ep.engine.core
    speculative = table.speculative
    state: dict[str, Any] = {
        "last_gen_throughput": core.gen_throughput(time.monotonic()),
        "memory_usage": _memory(ep),
    }
    if speculative:
        state["avg_spec_accept_length"] = core.accept_length()
    return {
        "model_path": ep.profile.model_path,
        "tokenizer_path": ep.profile.model_path,
        "served_model_name": ep.served_model_name,
        "host": ep.host,
        "port": ep.port,
        "context_length": ep.profile.context_length,
        "tp_size": ep.slot.gpus,
        "dp_size": 1,
        "max_running_requests": table.max_running_requests,
        "max_total_tokens": table.max_total_tokens,
        "max_prefill_tokens": ep.profile.max_prefill_tokens,
        "mem_fraction_static": ep.slot.mem_share,
        "speculative_algorithm": ep.speculative_algorithm,
        "speculative_draft_model_path": f"{ep.profile.model_path}-eagle3" if speculative else None,
        "speculative_num_steps": table.num_draft_tokens - 1 if speculative else None,
        "speculative_eagle_topk": 1 if speculative else None,
        "speculative_num_draft_tokens": table.num_draft_tokens if speculative else None,
        "speculative_adaptive": ep.role == "adaptive",
        "enable_metrics": ep.metrics is not None,
        "disable_radix_cache": ep.settings.disable_radix_cache,
        "enable_cache_report": ep.settings.enable_cache_report,
        "skip_server_warmup": False,
        "max_total_num_tokens": table.max_total_tokens,
        "max_req_input_len": max_req_input_len(ep.profile.context_length, table.max_total_tokens),
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "launch_command": ep.launch_command,
        "sim": {
            "role": ep.role,
            "profile": ep.profile.model_dump(),
            "time_scale": ep.settings.time_scale,
            "seed": ep.settings.seed,
            "group": ep.slot.group,
            "memory": {
                "gpus": ep.slot.gpus,
                "gpu_memory_gb": ep.profile.gpu_memory_gb,
                "mem_share": ep.slot.mem_share,
                "weights_gb": round(ep.slot.weights_gb, 3),
                "kv_budget_gb": round(ep.slot.kv_budget_gb, 3),
                "kv_bytes_per_token": round(ep.slot.kv_bytes_per_token),
                "max_total_tokens": ep.slot.max_total_tokens,
            },
        },
    }


def _memory(ep: Endpoint) -> dict[str, Any]:
    """Rank 0's memory, as SGLang reports it: per GPU."""
    slot = ep.slot
    return {
        "weight_gb": round(slot.weights_gb / slot.gpus, 3),
        "kv_cache_gb": round(slot.kv_budget_gb / slot.gpus, 3),
        "graph_gb": 0.0,
        "token_capacity": ep.table.max_total_tokens,
    }


def load_entry(ep: Endpoint, include: set[str] | None) -> dict[str, Any]:
    """One `loads[]` entry of `/v1/loads` (rank 0, the only rank); `include` as validated by the caller."""
    core, table = ep.engine.core, ep.table
    running, used = len(core.running), core.used_tokens()
    capacity = table.max_total_tokens
    entry: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": len(core.waiting),
        "num_waiting_uncached_tokens": core.waiting_uncached_tokens(),
        "num_used_tokens": used,
        "num_total_tokens": core.reserved_tokens(),
        "num_active_tokens": used,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": capacity,
        "max_running_requests": table.max_running_requests,
        "token_usage": used / capacity,
        "gen_throughput": core.gen_throughput(time.monotonic()),
        "cache_hit_rate": round(core.cache_hit_rate, 4),
        "utilization": running / table.max_running_requests,
        "total_prefill_uncached_tokens": core.prefill_tokens_total,
        "total_prefill_busy_us": int(core.prefill_busy_seconds * 1e6 * ep.settings.time_scale),
        "decode_moments": list(core.decode_moments) if core.decode_moments[0] > 0 else None,
    }
    sections = include or {"all"}
    every = "all" in sections
    if every or "memory" in sections:
        entry["memory"] = _memory(ep)
    if table.speculative and (every or "spec" in sections):
        accept = core.accept_length()
        entry["speculative"] = {"accept_length": accept, "accept_rate": (accept - 1.0) / (table.num_draft_tokens - 1)}
    if every or "disagg" in sections:  # SGLang reports it on every server; "null" outside PD disaggregation
        entry["disaggregation"] = {
            "mode": "null",
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        }
    if every or "queues" in sections:
        entry["queues"] = {
            "waiting": len(core.waiting),
            "grammar": 0,
            "paused": 0,
            "retracted": 0,
            "prealloc_ready": 0,
        }
    return entry


def loads(ep: Endpoint, include: set[str] | None, dp_rank: int | None) -> dict[str, Any]:
    """`GET /v1/loads` as JSON."""
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": SGLANG_VERSION,
        "accelerator": ep.profile.accelerator,
        "num_accelerators": ep.slot.gpus,
        "loads": [load_entry(ep, include)] if dp_rank in (None, 0) else [],
    }


def loads_prometheus(ep: Endpoint, include: set[str] | None, dp_rank: int | None) -> str:
    """`GET /v1/loads?format=prometheus`: every number as a gauge `sglang_<key>{dp_rank="0"}`."""
    if dp_rank not in (None, 0):
        return "\n"
    prefixes = {"speculative": "spec", "disaggregation": "disagg"}
    lines: list[str] = []
    for key, value in load_entry(ep, include).items():
        if key == "dp_rank":
            continue
        items = (
            [(f"sglang_{prefixes.get(key, key)}_{sub}", v) for sub, v in value.items()]
            if isinstance(value, dict)
            else [(f"sglang_{key}", value)]
        )
        for name, number in items:
            if isinstance(number, (int, float)):
                lines.append(f"# TYPE {name} gauge")
                lines.append(f'{name}{{dp_rank="0"}} {number}')
    return "\n".join(lines) + "\n"
