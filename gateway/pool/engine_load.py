"""One backend's own `/v1/loads` as the gateway keeps it: what only the engine knows about its load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineLoad:
    """One backend's own `/v1/loads`, as last fetched by the health checker."""

    version: str | None
    accelerator: str | None
    num_accelerators: int
    ranks: tuple[dict[str, Any], ...]  # its `loads[]` entries, one per DP rank
    # Its KV cache's capacity in tokens (`max_total_num_tokens`) over all its ranks, and the smallest rank's:
    # the longest request it surely holds (a request runs on one rank). 0: not reported. Read per routing
    # decision, so worked out once here.
    kv_tokens: int = field(init=False)
    kv_rank_tokens: int = field(init=False)
    # Its prefill work since it started, over all its ranks: uncached prompt tokens prefilled and the
    # microseconds its prefill steps took (SGLang's cumulative `total_prefill_uncached_tokens` and
    # `total_prefill_busy_us`; 0 where not reported).
    prefill_tokens: int = field(init=False)
    prefill_busy_us: int = field(init=False)
    # Its decode step-time moment sums (`decode_moments`: steps, batch, step us, batch squared, batch times
    # step, tokens generated), from an engine of one rank (several ranks' steps are not one server's load).
    decode_moments: tuple[float, ...] | None = field(init=False)

    def __post_init__(self) -> None:
        capacities = [as_int(rank.get("max_total_num_tokens")) for rank in self.ranks]
        object.__setattr__(self, "kv_tokens", sum(capacities))
        object.__setattr__(self, "kv_rank_tokens", min(capacities, default=0))
        object.__setattr__(self, "prefill_tokens", sum(as_int(rank.get("total_prefill_uncached_tokens")) for rank in self.ranks))
        object.__setattr__(self, "prefill_busy_us", sum(as_int(rank.get("total_prefill_busy_us")) for rank in self.ranks))
        object.__setattr__(self, "decode_moments", _moments(self.ranks[0].get("decode_moments")) if len(self.ranks) == 1 else None)


def parse_engine_load(body: Any) -> EngineLoad | None:
    """A backend's `/v1/loads` JSON as an `EngineLoad`; None when it is not that shape."""
    if not isinstance(body, dict) or not isinstance(body.get("loads"), list):
        return None
    ranks = tuple(r for r in body["loads"] if isinstance(r, dict))
    version, accelerator = body.get("version"), body.get("accelerator")
    return EngineLoad(
        version if isinstance(version, str) else None,
        accelerator if isinstance(accelerator, str) else None,
        as_int(body.get("num_accelerators")),
        ranks,
    )


def engine_load_json(load: EngineLoad | None) -> dict[str, Any] | None:
    """`load` as the `/v1/loads` JSON it was parsed from (for the board); None for None."""
    if load is None:
        return None
    return {"version": load.version, "accelerator": load.accelerator, "num_accelerators": load.num_accelerators, "loads": list(load.ranks)}


def _moments(value: Any) -> tuple[float, ...] | None:
    """SGLang's six decode moment sums as floats; None when absent or not that shape."""
    if not isinstance(value, list) or len(value) != 6:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return tuple(float(v) for v in value)


def as_int(value: Any) -> int:
    """A reported count as an int; 0 when it is missing or not a number."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def as_float(value: Any) -> float:
    """A reported figure as a float; 0.0 when it is missing or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
