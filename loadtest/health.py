"""Was the load generator the bottleneck? Each level's self-checks against fixed limits."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.results import LevelResult
from loadtest.verdicts import Health

# Limits past which a level's numbers may reflect the machine rather than the server: the load
# generator's loop woke late (shifts every timestamp it takes), it used most of a core, the whole
# machine was saturated, the simulator's steps ended late by a visible share of a step, or the
# data-parallel balancer (one event loop that relays every chunk) used most of a core.
MAX_LOOP_LAG_P99_MS = 10.0
MAX_LOADGEN_CPU_PCT = 85.0
MAX_BALANCER_CPU_PCT = 85.0
MAX_MACHINE_BUSY_PCT = 90.0
MAX_SIM_LATENESS_SHARE = 0.10

LIMITS = {
    "loop_lag_p99_ms": MAX_LOOP_LAG_P99_MS,
    "loadgen_cpu_pct": MAX_LOADGEN_CPU_PCT,
    "balancer_cpu_pct": MAX_BALANCER_CPU_PCT,
    "machine_busy_pct": MAX_MACHINE_BUSY_PCT,
    "sim_step_lateness_share_of_step": MAX_SIM_LATENESS_SHARE,
}


def assess(levels: Sequence[LevelResult]) -> Health:
    """Worst self-check figures over the sweep, and which levels crossed a limit."""
    worst_lag = worst_cpu = worst_busy = 0.0
    worst_slip: float | None = None
    worst_balancer: float | None = None
    flagged: list[str] = []
    for level in levels:
        where = level.label
        for name, t in level.targets.items():
            mon = t.monitor
            lag = mon.loop_lag_p99_ms or 0.0
            cpu = mon.cpu.get("loadgen_cpu_pct", 0.0)
            busy = mon.cpu.get("machine_busy_pct", 0.0)
            balancer = mon.cpu.get("balancer_cpu_pct")
            if balancer is not None:
                worst_balancer = max(worst_balancer or 0.0, balancer)
            slips = mon.sim_lateness_ms()
            if slips:
                worst_slip = max(worst_slip or 0.0, max(slips))
            worst_lag, worst_cpu, worst_busy = max(worst_lag, lag), max(worst_cpu, cpu), max(worst_busy, busy)
            reasons = []
            if lag > MAX_LOOP_LAG_P99_MS:
                reasons.append(f"loop lag p99 {lag:.1f} ms")
            if cpu > MAX_LOADGEN_CPU_PCT:
                reasons.append(f"load generator CPU {cpu:.0f}%")
            if balancer is not None and balancer > MAX_BALANCER_CPU_PCT:
                reasons.append(f"balancer CPU {balancer:.0f}%")
            if busy > MAX_MACHINE_BUSY_PCT:
                reasons.append(f"machine {busy:.0f}% busy")
            step = t.stats.mean_chunk_interval_ms
            if slips and step and max(slips) > MAX_SIM_LATENESS_SHARE * step:
                reasons.append(f"simulator steps {max(slips):.2f} ms late on average (steps of {step:.2f} ms)")
            if reasons:
                flagged.append(f"{name} {where}: " + ", ".join(reasons))
    return Health(LIMITS, worst_lag, worst_cpu, worst_busy, worst_slip, tuple(flagged), worst_balancer)
