"""Everything `specgate sim` is started with, validated in one place."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from backends.resolve import colocated_shares, memory_split, request_kv_gb
from backends.sim.faults import FaultSpec
from backends.sim.profiles import DEFAULT_PROFILE, Profile, Role

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
Port = Annotated[int, Field(ge=0, le=65535)]
MemShare = Annotated[float, Field(gt=0, lt=1)]


class SimSettings(BaseModel):
    """Options of one simulator process: K replicas of one role (one port each, each its own simulated
    GPUs), or K co-located groups (an eagle and a plain port each, both on the group's GPU timeline).
    """

    model_config = ConfigDict(extra="forbid")

    role: Role | None = None
    port: list[Port] = Field(default_factory=list, description="one per replica; 0 picks a free port")
    colocated: bool = False
    eagle_port: list[Port] = Field(default_factory=list, description="one per co-located group")
    plain_port: list[Port] = Field(default_factory=list, description="one per co-located group")
    eagle_only_port: list[Port] = Field(default_factory=list, description="one per EAGLE-only group (with colocated)")
    plain_only_port: list[Port] = Field(default_factory=list, description="one per plain-only group (with colocated)")
    eagle_mem_fraction: MemShare | None = None
    plain_mem_fraction: MemShare | None = None
    gpus_per_group: int | None = Field(default=None, ge=1, description="default: the profile's num_gpus")
    host: str = "127.0.0.1"
    profile: str = DEFAULT_PROFILE
    profile_file: Path | None = None
    time_scale: float = Field(default=1.0, gt=0, description="multiplies every modelled duration")
    seed: int = 0
    served_model_name: str | None = None
    api_key: SecretStr | None = None
    admin_api_key: SecretStr | None = None
    startup_delay: float = Field(
        default=0.0, ge=0, description="seconds of 503 from /health and /ready after the port is bound"
    )
    enable_metrics: bool = False
    extra_metric_labels: dict[str, str] = Field(default_factory=dict)
    max_running_requests: int | None = Field(default=None, ge=1)
    eagle_max_running_requests: int | None = Field(default=None, ge=1)
    plain_max_running_requests: int | None = Field(default=None, ge=1)
    enable_test_endpoints: bool = False
    enable_response_store: bool = False  # SGLang's --enable-response-store: keep Responses API responses
    disable_radix_cache: bool = False  # SGLang's --disable-radix-cache: no prefix cache
    enable_cache_report: bool = False  # SGLang's --enable-cache-report: cached tokens in chat/completions usage
    test_faults: list[FaultSpec] = Field(default_factory=list)
    drain_timeout: float = Field(default=30.0, ge=0, description="wall seconds SIGTERM waits for running requests")
    log_level: LogLevel = "info"

    @field_validator("served_model_name")
    @classmethod
    def _no_colon(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            raise ValueError(f"served model name may not contain ':' (SGLang reads it as a LoRA adapter): {value!r}")
        return value

    @field_validator("extra_metric_labels")
    @classmethod
    def _label_names(cls, labels: dict[str, str]) -> dict[str, str]:
        for name in labels:
            if not name.isidentifier() or name.startswith("__"):
                raise ValueError(f"extra metric label {name!r} is not a valid Prometheus label name")
        return labels

    @model_validator(mode="after")
    def _one_topology(self) -> SimSettings:
        if self.colocated:
            if self.role is not None or self.port:
                raise ValueError("--colocated runs both roles: give --eagle-port and --plain-port, not --role/--port")
            if not (self.eagle_port or self.eagle_only_port) or not (self.plain_port or self.plain_only_port):
                raise ValueError(
                    "--colocated needs an EAGLE and a plain server: --eagle-port and --plain-port (a co-located "
                    "group), or --eagle-only-port and --plain-only-port"
                )
            if len(self.eagle_port) != len(self.plain_port):
                raise ValueError(
                    f"--colocated serves one eagle and one plain port per group: got {len(self.eagle_port)} "
                    f"--eagle-port and {len(self.plain_port)} --plain-port"
                )
            if self.max_running_requests is not None:
                raise ValueError("--colocated sets each role's cap: --eagle/--plain-max-running-requests")
        else:
            if self.role is None or not self.port:
                raise ValueError("give --role and --port (or --colocated with --eagle-port and --plain-port)")
            if self.eagle_port or self.plain_port or self.eagle_only_port or self.plain_only_port:
                raise ValueError(
                    "--eagle-port/--plain-port/--eagle-only-port/--plain-only-port only apply with --colocated"
                )
            if self.eagle_max_running_requests is not None or self.plain_max_running_requests is not None:
                raise ValueError("--eagle/--plain-max-running-requests only apply with --colocated")
            if self.eagle_mem_fraction is not None or self.plain_mem_fraction is not None:
                raise ValueError("--eagle/--plain-mem-fraction only apply with --colocated")
        counts = Counter(self.port + self.eagle_port + self.plain_port + self.eagle_only_port + self.plain_only_port)
        repeated = sorted(port for port, n in counts.items() if port and n > 1)
        if repeated:
            raise ValueError(f"port {repeated[0]} is given more than once")
        return self

    def running_cap(self, role: Role) -> int | None:
        """The running-request cap that overrides the profile's for `role`, if one was given."""
        per_role = {"eagle": self.eagle_max_running_requests, "plain": self.plain_max_running_requests}
        return per_role.get(role) or self.max_running_requests

    def groups(self) -> list[list[tuple[Role, int]]]:
        """The (role, port) pairs this process serves, by group: servers of one group share its GPUs.

        With `colocated`, the pairs' groups come first, then each EAGLE-only group's one server, then each
        plain-only group's.
        """
        if self.colocated:
            pairs: list[list[tuple[Role, int]]] = [
                [("eagle", e), ("plain", p)] for e, p in zip(self.eagle_port, self.plain_port, strict=True)
            ]
            alone: list[list[tuple[Role, int]]] = [[("eagle", p)] for p in self.eagle_only_port]
            return pairs + alone + [[("plain", p)] for p in self.plain_only_port]
        assert self.role is not None
        return [[(self.role, port)] for port in self.port]

    def mem_share(self, role: Role, profile: Profile, *, alone: bool) -> float:
        """Share of its group's GPU memory a server of `role` takes: co-located, its split; alone on its group's
        GPUs (`alone`, or a process without `colocated`), the profile's."""
        if alone or not self.colocated:
            return profile.mem_fraction_static
        given = {"eagle": self.eagle_mem_fraction, "plain": self.plain_mem_fraction}
        split = memory_split(profile.memory, self.gpus_per_group or profile.num_gpus, plain_kv_floor_gb=request_kv_gb(profile))
        return colocated_shares(given, split)[role]

    def metric_labels(self, role: Role) -> dict[str, str]:
        """Extra metric labels of one endpoint; colocated endpoints are told apart by `pool=<role>`."""
        if self.colocated:
            return {**self.extra_metric_labels, "pool": role}
        return dict(self.extra_metric_labels)
