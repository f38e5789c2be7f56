"""Gateway configuration: one TOML file, every key also settable as a SPECGATE_... variable.

Nested keys use a double underscore: `SPECGATE_POLICY__THRESHOLD=4`,
`SPECGATE_SERVER__PORT=9000`. Lists and tables take JSON: `SPECGATE_SECURITY__API_KEYS='["k1"]'`.
Precedence, highest first: command-line flags, environment, the TOML file, defaults.

With no `[[backends]]` the gateway starts its own (the `[launch]` table; by default two
simulated servers), so `specgate serve` with no file at all is a complete demo.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from backends.config import LaunchConfig
from backends.sglang_args import with_priority_scheduling

EAGLE = "eagle"
PLAIN = "plain"
PAIR_POLICIES = ("threshold", "spill")  # the fixed rules: one EAGLE + plain pair only
COLOCATED_GROUP = "colocated"  # the one group of external backends declared co-located by the policy flag
MAX_AUTO_WORKERS = 8  # beyond this the shared accept queue and the backends, not the relay, are the limit


class _Section(BaseModel):
    # An error never echoes its input: a table's input can hold API keys (SecretStr only once valid).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    drain_timeout: float = Field(default=30.0, description="seconds in-flight requests get on shutdown")
    workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="worker processes sharing the listening socket; unset: one per available core, at most 8; "
        "1: a single process",
    )
    model_name: str | None = Field(
        default=None, description="model id clients use; the backends' served name when unset"
    )


class BackendConfig(_Section):
    """An SGLang (or compatible) server the gateway routes to."""

    name: str
    url: str
    speculative: bool
    api_key: SecretStr | None = None
    served_model_name: str | None = Field(
        default=None, description="upstream model id; read from its /v1/models when unset"
    )
    max_connections: int = 1024
    group: str | None = Field(
        default=None,
        description="backends of one group share GPUs; unset: a group of its own "
        "(or, with policy.adaptive_colocated = true and no group named anywhere, one group of all)",
    )


class PolicyConfig(_Section):
    name: Literal["threshold", "spill", "adaptive"] = Field(
        default="adaptive", description="adaptive learns the crossover; threshold and spill are fixed rules"
    )
    threshold: int = Field(
        default=1, ge=0, description="threshold: EAGLE while total in-flight < this (1: only a lone request)"
    )
    eagle_max_inflight: int = Field(default=48, ge=0, description="spill: EAGLE while its in-flight < this")
    adaptive_eagle_cap: int = Field(
        default=128,
        ge=1,
        description=(
            "adaptive: most requests EAGLE gets at once; the launched EAGLE server runs that many, so its "
            "measured TPOT shows its real batch cost (set it <= --max-running-requests of an external server)"
        ),
    )
    adaptive_slo_tpot_ms: float | None = Field(
        default=None, gt=0, description="adaptive: target TPOT; when no backend meets it, least harm to the target"
    )
    adaptive_probe_every: int = Field(
        default=200,
        ge=1,
        description="adaptive: an idle backend unused for this many decisions gets one probe "
        "(backs off up to 16x while probes confirm the fit)",
    )
    adaptive_half_life: float = Field(
        default=200.0, gt=0, description="adaptive: observations until old TPOT evidence counts half"
    )
    adaptive_move_running: bool = Field(
        default=True,
        description="adaptive: when a co-located group switches mode, its streams still decoding on the other "
        "server go on on the mode's server where the time saved pays for re-prefilling them (chat and "
        "completions streams of one choice: their text so far is given back there)",
    )
    adaptive_handover: bool = Field(
        default=True,
        description="adaptive: a stream sent to an EAGLE server whose group's plain server holds far more of its "
        "prompt's prefix is answered its first token by the plain server and goes on on EAGLE (its text so far "
        "given back there, as a move's); needs adaptive_move_running",
    )
    adaptive_drain: bool = Field(
        default=True,
        description="adaptive: once requests stop coming, a co-located group running plain decode moves its "
        "streams to its EAGLE server when their longest has a long tail still to come and the faster decode "
        "pays for their re-prefill (they come back with the next request); needs adaptive_move_running",
    )
    adaptive_colocated: bool | None = Field(
        default=None,
        description="adaptive: both servers share GPUs (steps serialize); unset: the [launch] topology when launching",
    )

    tier_priority_headroom: float = Field(
        default=0.35,
        ge=0.0,
        lt=1.0,
        description="service tiers: while priority traffic is present, default traffic takes a partitioned EAGLE "
        "backend only where it is predicted at least this share faster, so EAGLE keeps a faster lane for priority",
    )
    tier_priority_slots: int = Field(
        default=8,
        ge=0,
        description="service tiers: EAGLE slots (of its cap) that only priority requests take while priority "
        "traffic is present, so a priority request never finds EAGLE full of default traffic",
    )
    tier_priority_window: int = Field(
        default=1000,
        ge=1,
        description="service tiers: routing decisions after the last priority request during which its lane is kept",
    )
    tier_flex_inflight_share: float = Field(
        default=0.75,
        gt=0.0,
        le=1.0,
        description="service tiers: flex requests get 429 once the gateway holds this share of its in-flight limit",
    )
    tier_sglang_priority: bool = Field(
        default=False,
        description="service tiers: send SGLang's `priority` field (priority 1, default 0, flex -1) and launch "
        "SGLang servers with --enable-priority-scheduling",
    )

    @property
    def eagle_cap(self) -> int:
        """The most requests this policy sends the speculative backend at once (sizes its server)."""
        if self.name == "threshold":
            return max(self.threshold, 1)
        if self.name == "spill":
            return max(self.eagle_max_inflight, 1)
        return self.adaptive_eagle_cap


class TimeoutConfig(_Section):
    connect: float = 5.0
    first_byte: float = Field(default=600.0, description="until upstream headers (SGLang sends them with the first token)")
    idle: float = Field(default=120.0, description="longest silence between two chunks of a response")


class HealthConfig(_Section):
    ready_interval: float = 1.0
    ready_timeout: float = 2.0
    health_interval: float = 30.0
    health_timeout: float = Field(default=25.0, description="SGLang's own /health gives up after 20 s")
    max_consecutive_failures: int = Field(
        default=3,
        ge=1,
        description="refused or reset connections on real traffic in a row that take a backend out "
        "even while its probe still passes (a single one is only confirmed by a probe)",
    )


class TenantConfig(_Section):
    """A named client of the gateway: its keys and its limits (unset: unlimited)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="metric label and log field")
    api_keys: list[SecretStr] = Field(min_length=1)
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1, description="prompt + completion, counted as relayed")
    max_inflight: int | None = Field(default=None, ge=1)
    service_tier: Literal["priority", "default", "flex"] | None = Field(
        default=None, description="the highest service tier it is served as; a request asking more gets this"
    )


class TelemetryConfig(_Section):
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces; unset: no tracing"
    )
    service_name: str = "specgate"
    sample_ratio: float = Field(
        default=0.01, ge=0.0, le=1.0, description="share of new traces recorded; a client's sampled flag is followed"
    )


class LoggingConfig(_Section):
    access_log: str = Field(default="stdout", description='"stdout", "off", or a file path (rotated by size)')
    access_log_max_bytes: int = Field(default=100 * 1024 * 1024, ge=4096, description="a file's size before rotation")
    access_log_backups: int = Field(default=5, ge=1, description="rotated files kept: <path>.1 (newest) .. <path>.N")


class SecurityConfig(_Section):
    api_keys: list[SecretStr] = Field(default_factory=list, description="client keys; empty means open")
    tenants: list[TenantConfig] = Field(default_factory=list, description="named clients with limits")
    admin_api_key: SecretStr | None = None
    metrics_public: bool = Field(default=True, description="/metrics without a key, as SGLang does")
    allow_route_header: bool = Field(default=True, description="honour x-specgate-route")

    @model_validator(mode="after")
    def _check_tenants(self) -> SecurityConfig:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique, got {names}")
        keys = [k.get_secret_value() for k in self.api_keys] + [k.get_secret_value() for t in self.tenants for k in t.api_keys]
        if len(set(keys)) != len(keys):
            raise ValueError("an API key may belong to one tenant only (or to api_keys)")  # never name the key
        return self


class LimitsConfig(_Section):
    max_body_bytes: int = 8 * 1024 * 1024
    max_header_bytes: int = Field(
        default=64 * 1024, ge=1024, description="request line plus headers; larger heads get 431"
    )
    max_inflight: int = Field(default=4096, ge=1, description="beyond this, 429 with Retry-After")
    fd_reserve: int = Field(
        default=64,
        ge=8,
        description="open files kept for everything but proxied requests (listening socket, logs, probes, "
        "metrics); the rest of the open-file limit, two per request, caps the requests in flight",
    )
    client_header_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="seconds a client has to send a complete request head, from its first byte (a new connection "
        "that sends nothing: from its accept); then 408 once a request line has begun, else a close",
    )
    client_body_timeout_seconds: float = Field(
        default=30.0, gt=0, description="longest wait between two reads of a request body; beyond it 408 and close"
    )
    max_connections_per_client: int = Field(
        default=0,
        ge=0,
        description="connections one client address may hold at once, over all workers; more are closed as they "
        "are accepted; 0: no cap",
    )


class Settings(BaseSettings):
    """The whole gateway configuration."""

    model_config = SettingsConfigDict(
        env_prefix="SPECGATE_", env_nested_delimiter="__", extra="forbid", toml_file=None, hide_input_in_errors=True
    )

    server: ServerConfig = Field(default_factory=ServerConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    backends: list[BackendConfig] = Field(default_factory=list)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _check_backends(self) -> Settings:
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique, got {names}")
        groups: dict[str, list[BackendConfig]] = {}
        for backend in self.grouped_backends:
            groups.setdefault(backend.group or backend.name, []).append(backend)
        for group, members in groups.items():
            kinds = [b.speculative for b in members]
            if kinds.count(True) > 1 or kinds.count(False) > 1:
                raise ValueError(f"group {group!r} may hold at most one speculative and one plain backend")
        if self.policy.name in PAIR_POLICIES:
            self._check_one_pair()
        return self

    def _check_one_pair(self) -> None:
        """Threshold and spill route between one EAGLE and one plain backend, so refuse more."""
        name = self.policy.name
        kinds = [b.speculative for b in self.backends]
        if self.backends and sorted(kinds) != [False, True]:
            raise ValueError(
                f"policy {name!r} serves one pair only: configure exactly one speculative and one plain "
                f"backend (got {kinds.count(True)} and {kinds.count(False)}), or use policy \"adaptive\" for groups"
            )
        launch = self.launch
        if self.launches_backends and launch.topology == "groups":
            count = len(launch.groups) if launch.groups is not None else -(-len(launch.gpus) // (launch.group_size or 1))
            if count > 1:
                raise ValueError(
                    f"policy {name!r} serves one pair only, but launch.topology = \"groups\" starts {count} groups: "
                    'use policy "adaptive" for groups'
                )

    @property
    def grouped_backends(self) -> list[BackendConfig]:
        """`backends` with each one's group filled in: its own, its name, or the co-located group."""
        one_group = self.policy.adaptive_colocated is True and all(b.group is None for b in self.backends)
        return [
            b if b.group is not None else b.model_copy(update={"group": COLOCATED_GROUP if one_group else b.name})
            for b in self.backends
        ]

    @property
    def resolved_workers(self) -> int:
        """`server.workers`, or one per core this process may run on, at most `MAX_AUTO_WORKERS`."""
        if self.server.workers is not None:
            return self.server.workers
        return max(1, min(len(os.sched_getaffinity(0)), MAX_AUTO_WORKERS))

    @property
    def launches_backends(self) -> bool:
        """True when the gateway starts its own backends instead of pointing at URLs."""
        return not self.backends

    @property
    def planned_launch(self) -> LaunchConfig:
        """The `[launch]` table the plan is built from: with `policy.tier_sglang_priority`, SGLang
        servers are started with priority scheduling, so the `priority` the gateway sends counts."""
        return with_priority_scheduling(self.launch) if self.policy.tier_sglang_priority else self.launch

    @property
    def resolved_policy(self) -> PolicyConfig:
        """The [policy] table with `adaptive_colocated` taken from the launch topology when unset."""
        if self.policy.adaptive_colocated is not None:
            return self.policy
        colocated = self.launches_backends and self.launch.topology in ("colocated", "groups")
        return self.policy.model_copy(update={"adaptive_colocated": colocated})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls),
        )


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Read the TOML file at `path` (if any), the environment, then apply `overrides`.

    `overrides` are top-level sections as dicts, e.g. `{"server": {"port": 9000}}`; they are merged
    into what the file and environment give, key by key.
    """
    file_cls: type[Settings] = Settings
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        file_cls = type("FileSettings", (Settings,), {"model_config": {**Settings.model_config, "toml_file": path}})
    base = file_cls()
    if not overrides:
        return base
    merged = base.model_dump()
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(merged.get(section), dict):
            merged[section] = {**merged[section], **values}
        else:
            merged[section] = values
    return Settings.model_validate(_reveal_secrets(merged))


def _reveal_secrets(value: Any) -> Any:
    """model_dump keeps SecretStr objects; turn them back into plain strings for re-validation."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {k: _reveal_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal_secrets(v) for v in value]
    return value
