"""Configuration of the backends specgate starts itself (the `[launch]` table of the gateway config).

Two engines share one schema: `sglang` runs the real servers on GPUs, `sim` runs `backends.sim`
with a calibrated profile. Three topologies: `partitioned` (each server on its own GPUs),
`colocated` (both on the same GPUs) and `groups` (K GPU sets, each running a co-located pair; the
`eagle` and `plain` tables are then templates applied to every group). Both engines produce the
same thing, a list of processes to supervise (see `backends.plan`), so the supervisor has one
code path.

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


def _check_gpu_ids(gpus: list[int]) -> list[int]:
    if any(g < 0 for g in gpus):
        raise ValueError(f"GPU ids are >= 0, got {gpus}")
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"GPU ids repeat: {gpus}")
    return gpus


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
        return _check_gpu_ids(gpus)


class LaunchConfig(_Strict):
    """What `specgate serve` starts and supervises when no external backend URLs are given."""

    engine: Literal["sglang", "sim"] = "sim"
    topology: Literal["partitioned", "colocated", "groups"] = "partitioned"

    # topology = "groups": the GPU sets, given whole or as `gpus` cut into groups of `group_size`.
    groups: list[list[int]] | None = Field(
        default=None, description="GPU ids of each group, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]"
    )
    group_size: int | None = Field(default=None, ge=1, description="cuts `gpus` into consecutive groups of this size")
    gpus: list[int] = Field(default_factory=list, description="the GPUs `group_size` cuts into groups")
    plain_only_groups: int = Field(
        default=0, ge=0, description="the last N groups run a plain server alone (no EAGLE server, no memory split)"
    )
    eagle_only_groups: int = Field(
        default=0,
        ge=0,
        description="the N groups before the plain-only ones run an EAGLE server alone (no plain server, no memory split)",
    )

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
    # Optional sizes that let the plan check that a group holds both copies of the weights.
    gpu_memory_gb: float | None = Field(default=None, gt=0.0, description="memory of each GPU, GB")
    target_weights_gb: float | None = Field(default=None, gt=0.0, description="the served model's weights, whole, GB")
    draft_weights_gb: float | None = Field(default=None, ge=0.0, description="the EAGLE-3 draft's weights, GB")
    # With the sizes, these keep a co-located plain server's KV room at or above the longest request.
    kv_bytes_per_token: float | None = Field(
        default=None, gt=0.0, description="the plain server's KV bytes per token (SGLang logs K + V size and #tokens)"
    )
    longest_request_tokens: int | None = Field(
        default=None,
        ge=1,
        description="prompt + output tokens of the longest request the node serves (the simulator: its context length)",
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

    @field_validator("gpus")
    @classmethod
    def _distinct_gpu_ids(cls, gpus: list[int]) -> list[int]:
        return _check_gpu_ids(gpus)

    @field_validator("groups")
    @classmethod
    def _disjoint_groups(cls, groups: list[list[int]] | None) -> list[list[int]] | None:
        if groups is None:
            return None
        if not groups:
            raise ValueError("give at least one group of GPU ids")
        owner: dict[int, int] = {}
        for index, gpus in enumerate(groups):
            if not gpus:
                raise ValueError(f"group {index} has no GPUs")
            _check_gpu_ids(gpus)
            for gpu in gpus:
                if gpu in owner:
                    raise ValueError(f"GPU {gpu} is in group {owner[gpu]} and group {index}: groups may not overlap")
                owner[gpu] = index
        return groups

    @model_validator(mode="after")
    def _group_keys(self) -> LaunchConfig:
        if self.topology != "groups":
            for key in ("groups", "group_size"):
                if getattr(self, key) is not None:
                    raise ValueError(f'launch.{key} applies only with topology = "groups"')
            for key in ("plain_only_groups", "eagle_only_groups"):
                if getattr(self, key):
                    raise ValueError(f'launch.{key} applies only with topology = "groups"')
            if self.gpus:
                raise ValueError(
                    'launch.gpus applies only with topology = "groups"; give launch.eagle.gpus / launch.plain.gpus'
                )
            return self
        if (self.groups is None) == (self.group_size is None):
            raise ValueError(
                'topology = "groups" needs launch.groups, or launch.group_size with launch.gpus (one of them)'
            )
        if self.groups is not None and self.gpus:
            raise ValueError("launch.gpus goes with launch.group_size; launch.groups lists the GPUs itself")
        if self.group_size is not None:
            if not self.gpus:
                raise ValueError("launch.group_size needs launch.gpus, the GPUs to cut into groups")
            if len(self.gpus) % self.group_size:
                raise ValueError(
                    f"launch.group_size = {self.group_size} does not divide the {len(self.gpus)} GPUs of launch.gpus"
                )
        count = len(self.group_gpus())
        # A node of one mode only is data parallelism: nothing for the gateway to choose.
        if self.plain_only_groups >= count:
            raise ValueError(
                f"launch.plain_only_groups = {self.plain_only_groups} leaves no co-located group of the "
                f"{count}; keep at least one group running EAGLE"
            )
        if self.eagle_only_groups + self.plain_only_groups > count:
            raise ValueError(
                f"launch.eagle_only_groups = {self.eagle_only_groups} and plain_only_groups = "
                f"{self.plain_only_groups} are more than the {count} groups"
            )
        if self.eagle_only_groups == count:
            raise ValueError(
                f"launch.eagle_only_groups = {self.eagle_only_groups} leaves no group running plain of the {count}"
            )
        for role in ("eagle", "plain"):
            if getattr(self, role).gpus:
                raise ValueError(
                    f'launch.{role}.gpus: with topology = "groups" each group\'s GPUs come from launch.groups '
                    "(or launch.gpus and launch.group_size)"
                )
        return self

    @model_validator(mode="after")
    def _memory_keys(self) -> LaunchConfig:
        keys = ("gpu_memory_gb", "target_weights_gb", "draft_weights_gb", "kv_bytes_per_token")
        given = {k: getattr(self, k) is not None for k in keys}
        if self.engine == "sglang" and (self.longest_request_tokens is None) != (self.kv_bytes_per_token is None):
            raise ValueError(
                "launch.longest_request_tokens and kv_bytes_per_token go together: the KV room of the longest "
                "request is its tokens times the bytes each takes"
            )
        if not any(given.values()):
            return self
        if self.engine == "sim":
            raise ValueError(
                "launch.gpu_memory_gb, target_weights_gb, draft_weights_gb and kv_bytes_per_token apply to "
                'engine = "sglang"; the simulator takes them from its profile'
            )
        missing = [k for k in ("gpu_memory_gb", "target_weights_gb") if not given[k]]
        if missing:
            raise ValueError(
                f"launch.{missing[0]} is needed too: the memory check needs the GPU memory and the weights"
            )
        return self

    def group_gpus(self) -> list[tuple[int, ...]]:
        """topology = "groups": each group's GPU ids, in order (empty for the other topologies)."""
        if self.groups is not None:
            return [tuple(g) for g in self.groups]
        if self.group_size is None:
            return []
        size = self.group_size
        return [tuple(self.gpus[i : i + size]) for i in range(0, len(self.gpus), size)]

    @model_validator(mode="after")
    def _backoff_order(self) -> LaunchConfig:
        if self.restart_backoff_max < self.restart_backoff_initial:
            raise ValueError(
                f"restart_backoff_max ({self.restart_backoff_max}) is below "
                f"restart_backoff_initial ({self.restart_backoff_initial})"
            )
        return self
