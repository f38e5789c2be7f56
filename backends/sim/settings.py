"""Everything `specgate sim` is started with, validated in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from backends.sim.faults import FaultSpec
from backends.sim.profiles import DEFAULT_PROFILE, Role

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class SimSettings(BaseModel):
    """Options of one simulator process (one role on one port, or both roles on one GPU timeline)."""

    model_config = ConfigDict(extra="forbid")

    role: Role | None = None
    port: int | None = Field(default=None, ge=0, le=65535, description="0 picks a free port")
    colocated: bool = False
    eagle_port: int | None = Field(default=None, ge=0, le=65535)
    plain_port: int | None = Field(default=None, ge=0, le=65535)
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
            if self.role is not None or self.port is not None:
                raise ValueError("--colocated runs both roles: give --eagle-port and --plain-port, not --role/--port")
            if self.eagle_port is None or self.plain_port is None:
                raise ValueError("--colocated needs --eagle-port and --plain-port")
            if self.max_running_requests is not None:
                raise ValueError("--colocated sets each role's cap: --eagle/--plain-max-running-requests")
            if self.eagle_port == self.plain_port and self.eagle_port != 0:
                raise ValueError(f"--eagle-port and --plain-port are both {self.eagle_port}")
        else:
            if self.role is None or self.port is None:
                raise ValueError("give --role and --port (or --colocated with --eagle-port and --plain-port)")
            if self.eagle_port is not None or self.plain_port is not None:
                raise ValueError("--eagle-port/--plain-port only apply with --colocated")
            if self.eagle_max_running_requests is not None or self.plain_max_running_requests is not None:
                raise ValueError("--eagle/--plain-max-running-requests only apply with --colocated")
        return self

    def running_cap(self, role: Role) -> int | None:
        """The running-request cap that overrides the profile's for `role`, if one was given."""
        per_role = {"eagle": self.eagle_max_running_requests, "plain": self.plain_max_running_requests}
        return per_role.get(role) or self.max_running_requests

    def endpoints(self) -> list[tuple[Role, int]]:
        """The (role, port) pairs this process serves."""
        if self.colocated:
            assert self.eagle_port is not None and self.plain_port is not None
            return [("eagle", self.eagle_port), ("plain", self.plain_port)]
        assert self.role is not None and self.port is not None
        return [(self.role, self.port)]

    def metric_labels(self, role: Role) -> dict[str, str]:
        """Extra metric labels of one endpoint; colocated endpoints are told apart by `pool=<role>`."""
        if self.colocated:
            return {**self.extra_metric_labels, "pool": role}
        return dict(self.extra_metric_labels)
