"""The simulator profile a calibration writes: `step_ms` tables, the limits of each server and the
memory they were taken at (the simulator's memory model checks and scales by it).

Only the standard library is imported, so the GPU measurement can write its profile on a machine
where the project itself is not installed.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


from benchmarks.calibrate.shape import LlamaShape

# A chat request without max_tokens ends here in the simulator (the built-in profiles' value).
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class RoleLimits:
    """Running caps and KV capacities of the plain and the EAGLE server."""

    plain_max_running: int
    eagle_max_running: int
    plain_max_total_tokens: int
    eagle_max_total_tokens: int

    @classmethod
    def from_memory(
        cls,
        shape: LlamaShape,
        *,
        total_memory: int,
        mem_fraction: float,
        target_weight_bytes: int,
        draft_weight_bytes: int,
        plain_max_running: int,
        eagle_max_running: int,
    ) -> RoleLimits:
        """KV tokens left by SGLang's static memory share once the weights are in (the EAGLE server
        also holds the draft head and its one layer of KV per token)."""
        budget = total_memory * mem_fraction - target_weight_bytes
        plain_tokens = int(budget // shape.kv_bytes_per_token(shape.layers))
        eagle_tokens = int((budget - draft_weight_bytes) // shape.kv_bytes_per_token(shape.layers + 1))
        if min(plain_tokens, eagle_tokens) < 1:
            raise ValueError(f"{total_memory} bytes at fraction {mem_fraction} leave no room for KV after the weights")
        return cls(plain_max_running, eagle_max_running, plain_tokens, eagle_tokens)


@dataclass(frozen=True)
class MeasuredMemory:
    """The device's memory and the weights' sizes a calibration measured at (GB: 10^9 bytes)."""

    gpu_memory_gb: float
    target_weights_gb: float
    draft_weights_gb: float
    mem_fraction_static: float
    node_gpus: int

    @classmethod
    def from_bytes(
        cls, *, total_memory: int, target_weight_bytes: int, draft_weight_bytes: int, mem_fraction: float, node_gpus: int
    ) -> MeasuredMemory:
        return cls(
            round(total_memory / 1e9, 3), round(target_weight_bytes / 1e9, 6), round(draft_weight_bytes / 1e9, 6),
            mem_fraction, node_gpus,
        )


def profile_tables(
    *,
    name: str,
    model_path: str,
    accelerator: str,
    context_length: int,
    eos_token_id: int,
    plain_steps: list[tuple[int, float]],
    eagle_steps: list[tuple[int, float]],
    tau: float,
    num_draft_tokens: int,
    prefill_ms_per_token: float,
    limits: RoleLimits,
    memory: MeasuredMemory,
) -> dict[str, Any]:
    """A complete profile in the simulator's file format, with step-time tables for both roles."""

    def table(steps: list[tuple[int, float]]) -> list[list[float]]:
        return [[batch, round(ms, 4)] for batch, ms in steps]

    prefill = round(prefill_ms_per_token, 6)
    return {
        "name": name,
        "model_path": model_path,
        "accelerator": f"{accelerator} (simulated)",
        "num_gpus": 1,
        "context_length": context_length,
        "default_max_tokens": DEFAULT_MAX_TOKENS,
        "eos_token_id": eos_token_id,
        **asdict(memory),
        "plain": {
            "step_ms": table(plain_steps),
            "tau": 1.0,
            "num_draft_tokens": 1,
            "max_running_requests": limits.plain_max_running,
            "prefill_ms_per_token": prefill,
            "max_total_tokens": limits.plain_max_total_tokens,
        },
        "eagle": {
            "step_ms": table(eagle_steps),
            "tau": tau,
            "num_draft_tokens": num_draft_tokens,
            "max_running_requests": limits.eagle_max_running,
            "prefill_ms_per_token": prefill,
            "max_total_tokens": limits.eagle_max_total_tokens,
        },
    }


def _value(value: Any) -> str:
    # JSON's strings, numbers and arrays are valid TOML; a table's rows go one per line.
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "[\n" + "".join(f"    {json.dumps(row)},\n" for row in value) + "]"
    return json.dumps(value)


def profile_toml(profile: dict[str, Any]) -> str:
    """A profile (scalars at the top, one table per role) as TOML text."""
    lines = [f"{key} = {_value(value)}" for key, value in profile.items() if not isinstance(value, dict)]
    for key, table in profile.items():
        if isinstance(table, dict):
            lines += ["", f"[{key}]", *(f"{k} = {_value(v)}" for k, v in table.items())]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != profile:
        raise ValueError("profile does not survive a TOML round trip")  # a value type this writer cannot express
    return text


def write_profile(path: Path, profile: dict[str, Any]) -> None:
    """Write a profile as TOML."""
    path.write_text(profile_toml(profile), encoding="utf-8")
