"""Choosing the simulators' time scale so 2 shared cores can keep up with the modelled stream.

Every simulated decode step sends one SSE chunk per running request; the simulator, the gateway
and the load generator each handle every chunk. The modelled chunk rate of a role at batch B is
`B / (t0 + a*B)`; `--time-scale auto` stretches time until the highest rate any level asks for
fits `CHUNK_BUDGET`. K data-parallel replicas split a level's C requests, each running a batch of
about C/K, and together emit K times one replica's chunk rate at that batch (more than one server
at C, since smaller batches step faster). An open-loop level's batch follows from its rate by
Little's law; its arrivals are stretched by the same scale, so the load it puts on the modelled
servers, like every ratio between targets, is unchanged by the scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from backends.sim.profiles import DEFAULT_PROFILE, Profile, RoleProfile, load_profile
from loadtest.workloads.plan import Plan

# Chunks per second (summed over all streams) for the simulator + gateway + load generator on this
# 2-core machine: `python -m benchmarks.chunk_budget` measured TPOT within 1% of the model up to
# ~4,700/s through specgate and 5% off at 7,000/s (docs/benchmarks/loadtest-chunk-budget.md);
# half the good rate leaves room for a machine that is also busy with other work.
CHUNK_BUDGET = 2000.0
# Below this, steps get so short that timer granularity and scheduling jitter of the shared
# cores become a visible share of each step.
MIN_SCALE = 0.5


def chunk_rate(role: RoleProfile, concurrency: int) -> float:
    """Modelled SSE chunks per second a role emits at this closed-loop concurrency (time scale 1)."""
    batch = min(concurrency, role.max_running_requests)
    return 1000.0 * batch / role.step_ms(batch)


def open_loop_concurrency(role: RoleProfile, rate: float, mean_output: float, most: int) -> int:
    """Requests a server holds when offered `rate` requests/s of `mean_output` tokens, at most `most` (time scale 1).

    Little's law on the modelled decode: in flight = rate x a request's decode time, which grows with
    the batch; iterated up from one request to the first fixed point, or to `most` when the server
    cannot keep up and its queue grows for the whole level.
    """
    if math.isinf(rate):
        return most
    inflight = 1.0
    while inflight < most:
        batch = min(math.ceil(inflight), role.max_running_requests)
        grown = min(rate * mean_output / role.tokens_per_step(batch) * role.step_ms(batch) / 1000.0, most)
        if grown <= inflight + 1e-6:
            break
        inflight = grown
    return max(1, math.ceil(inflight))


@dataclass(frozen=True)
class LevelLoad:
    """What one level asks of the servers, in modelled time.

    `concurrency` requests at a time (closed loop), or `rate` requests/s (open loop) of
    `mean_output` tokens each, never more than the level's `requests` at once.
    """

    concurrency: int | None = None
    rate: float | None = None
    mean_output: float = 1.0
    requests: int = 1

    @classmethod
    def of(cls, plan: Plan) -> LevelLoad:
        """The load a level's plan offers."""
        return cls(plan.concurrency, plan.offered_request_s, plan.mean_output_len, plan.requests)

    def chunk_rate(self, role: RoleProfile, replicas: int = 1) -> float:
        """Modelled chunks per second `replicas` servers of `role` emit under this load (time scale 1)."""
        if self.concurrency is not None:
            c = self.concurrency
            return min(c, replicas) * chunk_rate(role, math.ceil(c / replicas))
        if self.rate is None:
            raise ValueError("a level load is a concurrency or a rate")
        each = math.ceil(self.requests / replicas)
        inflight = open_loop_concurrency(role, self.rate / replicas, self.mean_output, each)
        return min(self.requests, replicas) * chunk_rate(role, inflight)


def peak_chunk_rate(profile: Profile, loads: Iterable[LevelLoad], replicas: int = 1) -> float:
    """The highest modelled chunk rate of either server (or `replicas` of it sharing a level) over the levels."""
    return max(load.chunk_rate(role, replicas) for role in (profile.eagle, profile.plain) for load in loads)


def auto_time_scale(
    profile: Profile, levels: Iterable[LevelLoad | int], budget: float = CHUNK_BUDGET, replicas: int = 1
) -> tuple[float, str]:
    """The time scale for `--time-scale auto` (an int level is a closed-loop concurrency), and a sentence saying why."""
    loads = [LevelLoad(concurrency=lv) if isinstance(lv, int) else lv for lv in levels]
    peak = peak_chunk_rate(profile, loads, replicas)
    scale = max(round(peak / budget, 2), MIN_SCALE)
    over = f" over {replicas} replicas" if replicas > 1 else ""
    return scale, (
        f"auto: peak modelled chunk rate {peak:.0f}/s{over} at time scale 1, budget {budget:.0f}/s on this machine, "
        f"floor {MIN_SCALE:g}"
    )


def profile_for(name: str | None, path: Path | None) -> Profile:
    """The profile the envelope simulates: a built-in one, with a file's keys laid over it (as the simulator does)."""
    return load_profile(name or DEFAULT_PROFILE, path)
