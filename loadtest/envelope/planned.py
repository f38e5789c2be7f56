"""A planned node layout, as `specgate plan --json` prints it and `python -m loadtest envelope --plan` reads it.

The keys are a contract: `topology`, `groups`, `gpus_per_group`, `eagle_mem_fraction`,
`plain_mem_fraction`, `plain_only_groups`, `eagle_only_groups` (0 when absent) and `predicted` (the
planner's numbers per level, in the model's time). `hardware()` is the same-hardware envelope's `Hardware` for the layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loadtest.envelope.fair import Hardware


class PredictedLevel(BaseModel):
    """The planner's prediction for one level: the layout's numbers and its ratios to the best baseline."""

    model_config = ConfigDict(extra="forbid")

    level: str  # `C=8`, `4/s`, ...
    concurrency: int | None
    request_rate: float | None
    output_tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    throughput_ratio: float | None
    tpot_ratio: float | None
    e2e_p99_ratio: float | None
    best_baseline: str | None  # the baseline (and its grouping) the throughput ratio is taken against


class PlannedLayout(BaseModel):
    """One node layout: K groups of G GPUs, each co-located group's memory split, the last groups plain-only and
    those before them EAGLE-only."""

    model_config = ConfigDict(extra="forbid")

    topology: Literal["colocated", "groups"]
    groups: int = Field(ge=1)
    gpus_per_group: int = Field(ge=1)
    eagle_mem_fraction: float | None = Field(gt=0, lt=1)  # null: no co-located group, no split
    plain_mem_fraction: float | None = Field(gt=0, lt=1)
    plain_only_groups: int = Field(ge=0)
    eagle_only_groups: int = Field(default=0, ge=0)
    predicted: list[PredictedLevel]

    @model_validator(mode="after")
    def _consistent(self) -> PlannedLayout:
        if (self.topology == "colocated") != (self.groups == 1):
            raise ValueError(f"topology {self.topology!r} with {self.groups} group(s): colocated is the one-group case")
        if self.plain_only_groups >= self.groups:
            raise ValueError(f"plain_only_groups = {self.plain_only_groups} leaves none of the {self.groups} groups co-located")
        if self.eagle_only_groups + self.plain_only_groups > self.groups or self.eagle_only_groups == self.groups:
            raise ValueError(f"eagle_only_groups = {self.eagle_only_groups} and plain_only_groups = {self.plain_only_groups} "
                             f"do not leave both modes among the {self.groups} groups")
        return self

    def hardware(self) -> Hardware:
        """The layout as the envelope's hardware (its baselines run K x G GPUs each way)."""
        return Hardware(self.groups, self.gpus_per_group, self.eagle_mem_fraction, self.plain_mem_fraction,
                        self.plain_only_groups, self.eagle_only_groups)

    @classmethod
    def read(cls, path: Path) -> PlannedLayout:
        """The layout in a `specgate plan --json` file; ValueError saying what is wrong with it."""
        try:
            return cls.model_validate_json(path.read_bytes())
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        except ValidationError as exc:
            raise ValueError(f"{path} is not a `specgate plan --json` layout: {exc}") from None
