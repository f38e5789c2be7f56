"""Choosing the simulators' time scale so 2 shared cores can keep up with the modelled stream.

Every simulated decode step sends one SSE chunk per running request; the simulator, the gateway
and the load generator each handle every chunk. The modelled chunk rate of a role at batch B is
`B / (t0 + a*B)`; `--time-scale auto` stretches time until the highest rate any level asks for
fits `CHUNK_BUDGET`. K data-parallel replicas split a level's C requests, each running a batch of
about C/K, and together emit K times one replica's chunk rate at that batch (more than one server
at C, since smaller batches step faster). All ratios between targets are unchanged by the scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from backends.sim.profiles import DEFAULT_PROFILE, Profile, RoleProfile, load_profile

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


def peak_chunk_rate(profile: Profile, concurrencies: Iterable[int], replicas: int = 1) -> float:
    """The highest modelled chunk rate of either server (or `replicas` of it sharing a level) over the levels."""
    levels = list(concurrencies)
    return max(
        min(c, replicas) * chunk_rate(role, math.ceil(c / replicas))
        for role in (profile.eagle, profile.plain)
        for c in levels
    )


def auto_time_scale(
    profile: Profile, concurrencies: Iterable[int], budget: float = CHUNK_BUDGET, replicas: int = 1
) -> tuple[float, str]:
    """The time scale for `--time-scale auto`, and a sentence saying why."""
    peak = peak_chunk_rate(profile, concurrencies, replicas)
    scale = max(round(peak / budget, 2), MIN_SCALE)
    over = f" over {replicas} replicas" if replicas > 1 else ""
    return scale, (
        f"auto: peak modelled chunk rate {peak:.0f}/s{over} at time scale 1, budget {budget:.0f}/s on this machine, "
        f"floor {MIN_SCALE:g}"
    )


def profile_for(name: str | None, path: Path | None) -> Profile:
    """The profile the envelope simulates: a built-in one, with a file's keys laid over it (as the simulator does)."""
    return load_profile(name or DEFAULT_PROFILE, path)
