"""Calibration profiles: the step-time model of each simulated server role, and its analytic predictions.

A profile holds one table per role (`plain`, `eagle`, `adaptive`) in the file format of
`/work/shared/ref/calibration.md`. Two profiles are built in; a TOML or JSON file overrides any key
of the profile it is applied to, so a deployment can be simulated from its own measurements.

The `adaptive` table models one EAGLE server running SGLang's `--speculative-adaptive`: it speculates
while its running batch is below `adaptive_off_batch` and otherwise runs plain decode steps that still
pay the draft model's per-step cost (`off_overhead`). Every key left out of that table is derived from
the `eagle` and `plain` tables (see `derive_adaptive`), so overriding `eagle.tau` also moves the
adaptive server's behaviour.

Memory (`backends/memory.py`): a profile states each GPU's memory, the whole target model's and the
EAGLE-3 draft's weights, the lone-server `mem_fraction_static` its `max_total_tokens` were measured
at, and the GPUs of the node. From them each role's KV bytes per token follow (`kv_bytes_per_token`),
so a server given another share of memory (co-located) or other GPUs holds its own budget's tokens.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from backends.memory import ModelMemory, kv_budget_gb, kv_bytes_per_token
from backends.sim.builtin_profiles import BUILTIN_TABLES
from backends.sim.stepcurve import StepCurve, curve_from_keys, without_replaced_model

Role = Literal["plain", "eagle", "adaptive"]
ROLES: tuple[Role, ...] = ("plain", "eagle", "adaptive")

# vLLM measured the K=0 proposer at 1.71 ms of a 21.25 ms step (8%); see calibration.md sources.
DEFAULT_OFF_OVERHEAD = 0.08


class ProfileError(ValueError):
    """A profile name, file or value that cannot be used."""


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


# One measured point of a step-time table: [running requests, ms per decode step].
StepPoint = tuple[Annotated[int, Field(ge=1)], Annotated[float, Field(gt=0)]]


class RoleProfile(_Table):
    """Step-time model of one server: a step with B running requests takes `t0_ms + per_request_ms * B`,
    or follows the measured table `step_ms` (see `backends.sim.stepcurve`); `step_ms(B)` reads either."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    t0_ms: float | None = Field(default=None, gt=0, description="fixed cost of one decode step, ms")
    per_request_ms: float | None = Field(default=None, ge=0, description="added step cost per running request, ms")
    step_table: tuple[StepPoint, ...] | None = Field(
        default=None, alias="step_ms", description="[[B, ms], ...] measured step times, instead of t0_ms/per_request_ms"
    )
    tau: float = Field(default=1.0, ge=1.0, description="mean tokens per request per step (acceptance length)")
    num_draft_tokens: int = Field(default=1, ge=1, description="most tokens one request can gain in one step")
    max_running_requests: int = Field(ge=1)
    prefill_ms_per_token: float = Field(ge=0, description="prefill cost per prompt token, charged to the joining step")
    max_total_tokens: int = Field(ge=1, description="KV cache capacity in tokens")

    _curve: StepCurve = PrivateAttr()

    @model_validator(mode="after")
    def _check(self) -> RoleProfile:
        if self.tau > self.num_draft_tokens:
            raise ValueError(f"tau ({self.tau}) cannot exceed num_draft_tokens ({self.num_draft_tokens})")
        self._curve = StepCurve.of(self.t0_ms, self.per_request_ms, self.step_table)
        return self

    @property
    def speculative(self) -> bool:
        """Whether steps can yield more than one token per request."""
        return self.num_draft_tokens > 1

    def step_ms(self, batch: int) -> float:
        """Modelled duration of one decode step with `batch` running requests (prefill excluded), ms.

        The one reader of the step-time model: everything that needs a step's duration calls this.
        """
        return self._curve.at(batch)

    def tokens_per_step(self, batch: int) -> float:
        """Mean tokens one running request gains per step at this batch size."""
        return self.tau

    def is_speculating(self, batch: int) -> bool:
        """Whether a step at this batch size drafts tokens."""
        return self.speculative


class AdaptiveProfile(RoleProfile):
    """An EAGLE server that stops drafting at `adaptive_off_batch` running requests but keeps its cost."""

    plain_t0_ms: float | None = Field(default=None, gt=0, description="t0 of the plain decode step it falls back to, ms")
    plain_per_request_ms: float | None = Field(default=None, ge=0)
    plain_step_table: tuple[StepPoint, ...] | None = Field(
        default=None, alias="plain_step_ms", description="the plain step as a table, instead of the two keys above"
    )
    off_overhead: float = Field(
        default=DEFAULT_OFF_OVERHEAD, ge=0, description="draft cost when off, fraction of the plain step"
    )
    adaptive_off_batch: int = Field(ge=1, description="running batch size from which the server stops drafting")
    _plain_curve: StepCurve = PrivateAttr()

    @model_validator(mode="after")
    def _check_plain(self) -> AdaptiveProfile:
        self._plain_curve = StepCurve.of(self.plain_t0_ms, self.plain_per_request_ms, self.plain_step_table)
        return self

    def is_speculating(self, batch: int) -> bool:
        return batch < self.adaptive_off_batch

    def step_ms(self, batch: int) -> float:
        if self.is_speculating(batch):
            return super().step_ms(batch)
        return self._plain_curve.at(batch) * (1.0 + self.off_overhead)

    def tokens_per_step(self, batch: int) -> float:
        return self.tau if self.is_speculating(batch) else 1.0


class Profile(_Table):
    """A simulated deployment: the model it serves and one step-time table per server role."""

    name: str
    model_path: str = Field(description="reported as model_path and, unless overridden, the served model name")
    model_type: str = "llama"
    architectures: list[str] = Field(default_factory=lambda: ["LlamaForCausalLM"])
    accelerator: str = Field(description="GPU name reported by /v1/loads")
    num_gpus: int = Field(ge=1, description="GPUs behind each server (its TP size)")
    context_length: int = Field(ge=2)
    default_max_tokens: int = Field(
        ge=1, description="output length of a chat request without max_tokens: where the simulated model emits EOS"
    )
    eos_token_id: int = Field(default=2, description="reported as matched_stop when the simulated EOS ends a request")
    max_prefill_tokens: int = Field(
        default=16384, ge=1, description="prompt tokens admitted per step (SGLang's --max-prefill-tokens)"
    )
    gpu_memory_gb: float = Field(gt=0, description="memory of each GPU, GB")
    target_weights_gb: float = Field(gt=0, description="the served model's weights, whole (TP splits them), GB")
    draft_weights_gb: float = Field(ge=0, description="the EAGLE-3 draft's weights, whole, GB")
    mem_fraction_static: float = Field(
        gt=0, lt=1, description="share of memory a lone server takes; max_total_tokens are measured at it"
    )
    node_gpus: int = Field(ge=1, description="GPUs of one node, for how many groups it can hold")
    plain: RoleProfile
    eagle: RoleProfile
    adaptive: AdaptiveProfile

    @model_validator(mode="before")
    @classmethod
    def _fill_adaptive(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("eagle"), dict) and isinstance(data.get("plain"), dict):
            data = dict(data)
            data["adaptive"] = derive_adaptive(data["eagle"], data["plain"], data.get("adaptive") or {})
        return data

    @model_validator(mode="after")
    def _lone_servers_fit(self) -> Profile:
        if self.num_gpus > self.node_gpus:
            raise ValueError(f"num_gpus ({self.num_gpus}) exceeds node_gpus ({self.node_gpus})")
        for role in ROLES:
            if self.lone_kv_budget_gb(role) <= 0:
                raise ValueError(
                    f"a lone {role} server's weights ({self.memory.weights_gb(self.role(role).speculative):g} GB) "
                    f"leave no KV room in {self.mem_fraction_static:g} of {self.num_gpus} x {self.gpu_memory_gb:g} GB"
                )
        return self

    @property
    def memory(self) -> ModelMemory:
        """The GPU memory and the weights' sizes."""
        return ModelMemory(self.gpu_memory_gb, self.target_weights_gb, self.draft_weights_gb)

    def lone_kv_budget_gb(self, role: Role) -> float:
        """KV room of a lone `role` server on `num_gpus` GPUs at `mem_fraction_static`: it holds max_total_tokens."""
        speculative = self.role(role).speculative
        return kv_budget_gb(self.memory, self.num_gpus, self.mem_fraction_static, speculative=speculative)

    def kv_bytes_per_token(self, role: Role) -> float:
        """KV bytes per token of `role`: its lone server's KV room over its `max_total_tokens`."""
        return kv_bytes_per_token(self.lone_kv_budget_gb(role), self.role(role).max_total_tokens)

    def role(self, role: Role) -> RoleProfile:
        """The table of one role."""
        if role not in ROLES:
            raise ProfileError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        table: RoleProfile = getattr(self, role)
        return table

    def step_time_s(self, role: Role, batch: int) -> float:
        """Modelled decode step time at `batch` running requests, seconds (time-scale 1)."""
        return self.role(role).step_ms(batch) / 1000.0

    def output_throughput(self, role: Role, batch: int) -> float:
        """Modelled steady-state output tokens/s of one server with `batch` requests decoding (calibration.md)."""
        table = self.role(role)
        return batch * table.tokens_per_step(batch) * 1000.0 / table.step_ms(batch)

    def tpot_s(self, role: Role, batch: int) -> float:
        """Modelled time per output token of one request at `batch`, seconds: step time / tokens per step."""
        table = self.role(role)
        return table.step_ms(batch) / table.tokens_per_step(batch) / 1000.0

    def closed_loop_throughput(self, role: Role, concurrency: int, output_tokens: int, prompt_tokens: int) -> float:
        """Modelled output tokens/s of `concurrency` clients each sending fixed-length requests back to back.

        Each request costs one joining step (prefill plus its first token) and then enough decode
        steps to produce the rest at `tokens_per_step` each; every cycle of the batch also pays the
        prefill of all its requests. Clients beyond the running cap wait, adding no throughput.
        """
        table = self.role(role)
        batch = min(concurrency, table.max_running_requests)
        steps = 1 + (output_tokens - 1) / table.tokens_per_step(batch)
        cycle_ms = steps * table.step_ms(batch) + batch * prompt_tokens * table.prefill_ms_per_token
        return batch * output_tokens * 1000.0 / cycle_ms

    def crossover_batch(self, limit: int = 4096) -> int | None:
        """Smallest batch at which a plain server's throughput is at least the EAGLE server's; None within `limit`."""
        for batch in range(1, limit + 1):
            if self.output_throughput("plain", batch) >= self.output_throughput("eagle", batch):
                return batch
        return None


def derive_adaptive(eagle: dict[str, Any], plain: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The `[adaptive]` table: keys in `given` win, the rest come from the eagle and plain tables.

    Defaults are chosen to be fair to a single `--speculative-adaptive` server: its draft path and KV
    capacity are the EAGLE server's (the draft's weights and KV stay allocated), its running cap is
    raised to the plain server's (as an operator would, else SGLang's cap of 48 applies), and it stops
    drafting exactly where drafting stops paying even after the off-mode overhead.
    """
    copied = ("t0_ms", "per_request_ms", "step_ms", "tau", "num_draft_tokens", "prefill_ms_per_token", "max_total_tokens")
    table: dict[str, Any] = {key: eagle[key] for key in copied if key in eagle}
    for key in ("t0_ms", "per_request_ms", "step_ms"):
        if key in plain:
            table[f"plain_{key}"] = plain[key]
    table["max_running_requests"] = plain.get("max_running_requests")
    table["off_overhead"] = DEFAULT_OFF_OVERHEAD
    table = without_replaced_model(table, given)
    table.update(given)
    if "adaptive_off_batch" not in given:
        table["adaptive_off_batch"] = _best_off_batch(table)
    return table


def _best_off_batch(table: dict[str, Any]) -> int | None:
    """First batch size at which the off-mode step gives each request tokens at least as fast as drafting."""
    try:
        drafting, off = curve_from_keys(table), curve_from_keys(table, "plain_")
        tau, overhead, cap = float(table.get("tau", 1.0)), float(table["off_overhead"]), int(table["max_running_requests"])
    except (KeyError, TypeError, ValueError):
        return None  # validation of the table reports the missing or malformed key
    for batch in range(1, cap + 1):
        if tau * off.at(batch) * (1.0 + overhead) <= drafting.at(batch):
            return batch
    return cap + 1  # drafting pays at every batch the server can run: it never switches off


BUILTIN_PROFILES: dict[str, dict[str, Any]] = {p["name"]: p for p in BUILTIN_TABLES}
DEFAULT_PROFILE = "field-8gpu"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(without_replaced_model(base, override))
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_profile_file(path: Path) -> dict[str, Any]:
    """The raw tables of a TOML (`.toml`) or JSON file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(
            f"profile file {path} is not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path} must hold a table of keys, got {type(data).__name__}")
    return data


def load_profile(
    name: str = DEFAULT_PROFILE, path: Path | None = None, overrides: dict[str, Any] | None = None
) -> Profile:
    """Built-in profile `name`, with the keys of the file at `path` and then `overrides` laid over it."""
    if name not in BUILTIN_PROFILES:
        raise ProfileError(f"unknown profile {name!r}; built-in profiles are {', '.join(sorted(BUILTIN_PROFILES))}")
    data = BUILTIN_PROFILES[name]
    source = f"profile {name!r}"
    if path is not None:
        data = _merge(data, read_profile_file(path))
        source = f"profile file {path}"
    if overrides:
        data = _merge(data, overrides)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors())
        raise ProfileError(f"invalid {source}: {problems}") from exc
