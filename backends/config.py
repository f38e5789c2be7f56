"""Configuration of the backends specgate starts itself (the `[launch]` table of the gateway config).

Two engines share one schema: `sglang` runs the real servers on GPUs, `sim` runs `backends.sim`
with a calibrated profile. Both produce the same thing, a list of processes to supervise
(see `backends.plan`), so the supervisor has one code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerLaunchConfig(_Strict):
    """Per-backend launch settings; every unset value is derived by the plan."""

    gpus: list[int] = Field(default_factory=list, description="GPU ids this server may use")
    tp_size: int | None = Field(default=None, description="tensor parallel size; len(gpus) unless set")
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, description="None picks a free loopback port")
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    cuda_graph_max_bs_decode: int | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class LaunchConfig(_Strict):
    """What `specgate serve` starts and supervises when no external backend URLs are given."""

    engine: Literal["sglang", "sim"] = "sim"
    topology: Literal["partitioned", "colocated"] = "partitioned"

    # Real SGLang servers.
    model_path: str | None = None
    served_model_name: str | None = None
    draft_model_path: str | None = None
    speculative_algorithm: str = "EAGLE3"
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    python: str = "python3"
    backend_api_key: SecretStr | None = Field(
        default=None, description="--api-key given to the servers; used upstream, never shown to clients"
    )

    # Simulated servers.
    profile: str = "field-8gpu"
    profile_file: Path | None = None
    time_scale: float = 1.0
    seed: int = 0
    startup_delay: float = 0.0

    # Supervision.
    startup_timeout: float = Field(default=1800.0, description="seconds to wait for readiness")
    restart_backoff_initial: float = 1.0
    restart_backoff_max: float = 60.0
    stop_timeout: float = Field(default=30.0, description="SIGTERM to SIGKILL grace, seconds")

    eagle: ServerLaunchConfig = Field(default_factory=ServerLaunchConfig)
    plain: ServerLaunchConfig = Field(default_factory=ServerLaunchConfig)
