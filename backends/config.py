"""Configuration of the backends specgate starts itself (the `[launch]` table of the gateway config).

Two engines share one schema: `sglang` runs the real servers on GPUs, `sim` runs `backends.sim`
with a calibrated profile. Both produce the same thing, a list of processes to supervise
(see `backends.plan`), so the supervisor has one code path.

Values that would make SGLang or the simulator refuse to start are rejected here, with the key
named; combinations that start but are probably not what was meant (overlapping GPUs, a TP size
that leaves GPUs idle, ...) are warnings of the plan instead, so `specgate plan` can show them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

# SGLang 0.5.23's built-in speculative algorithms (srt/speculative/spec_info.py); NEXTN is EAGLE.
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerLaunchConfig(_Strict):
    """Per-backend launch settings; every unset value is derived by the plan."""

    gpus: list[int] = Field(default_factory=list, description="GPU ids this server may use")
    tp_size: int | None = Field(default=None, ge=1, description="tensor parallel size; len(gpus) unless set")
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="None picks a free loopback port")
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description=(
            "partitioned: passed to SGLang as is; colocated: this server's share of the whole GPU "
            "memory (the plan converts it to SGLang's 'share of what is free when I start')"
        ),
    )
    max_running_requests: int | None = Field(default=None, ge=1)
    cuda_graph_max_bs_decode: int | None = Field(default=None, ge=1)
    extra_args: list[str] = Field(default_factory=list, description="appended to the server's argv as is")
    env: dict[str, str] = Field(default_factory=dict, description="set on top of the inherited environment")

    @field_validator("gpus")
    @classmethod
    def _distinct_gpu_ids(cls, gpus: list[int]) -> list[int]:
        if any(g < 0 for g in gpus):
            raise ValueError(f"GPU ids are >= 0, got {gpus}")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU ids repeat: {gpus}")
        return gpus


class LaunchConfig(_Strict):
    """What `specgate serve` starts and supervises when no external backend URLs are given."""

    engine: Literal["sglang", "sim"] = "sim"
    topology: Literal["partitioned", "colocated"] = "partitioned"

    # Real SGLang servers.
    model_path: str | None = None
    served_model_name: str | None = None
    draft_model_path: str | None = None
    speculative_algorithm: str = "EAGLE3"
    num_steps: int = Field(default=3, ge=1)
    eagle_topk: int = Field(default=1, ge=1)
    num_draft_tokens: int = Field(default=4, ge=2)
    python: str = Field(default="python3", description="interpreter that has sglang installed")
    backend_api_key: SecretStr | None = Field(
        default=None, description="--api-key given to the servers; used upstream, never shown to clients"
    )

    # Simulated servers.
    profile: str = "field-8gpu"
    profile_file: Path | None = None
    time_scale: float = Field(default=1.0, gt=0.0)
    seed: int = 0
    startup_delay: float = Field(default=0.0, ge=0.0)

    # Supervision.
    startup_timeout: float = Field(
        default=1800.0, gt=0.0, description="seconds each server may take from its start until /ready answers 200"
    )
    restart_backoff_initial: float = Field(default=1.0, gt=0.0)
    restart_backoff_max: float = Field(default=60.0, gt=0.0)
    stop_timeout: float = Field(default=30.0, gt=0.0, description="SIGTERM to SIGKILL grace, seconds")

    eagle: ServerLaunchConfig = Field(default_factory=ServerLaunchConfig)
    plain: ServerLaunchConfig = Field(default_factory=ServerLaunchConfig)

    @field_validator("speculative_algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        if value.upper() not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"unknown speculative_algorithm {value!r}; SGLang has {', '.join(SPECULATIVE_ALGORITHMS)}")
        return value.upper()

    @field_validator("served_model_name")
    @classmethod
    def _no_colon(cls, value: str | None) -> str | None:
        # SGLang parses `base:adapter` in model ids as a LoRA reference, so it refuses such names.
        if value is not None and ":" in value:
            raise ValueError(f"served_model_name may not contain ':' (SGLang reads it as a LoRA adapter): {value!r}")
        return value

    @model_validator(mode="after")
    def _backoff_order(self) -> LaunchConfig:
        if self.restart_backoff_max < self.restart_backoff_initial:
            raise ValueError(
                f"restart_backoff_max ({self.restart_backoff_max}) is below "
                f"restart_backoff_initial ({self.restart_backoff_initial})"
            )
        return self
