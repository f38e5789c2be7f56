"""Greedy-per-request vs system-optimal routing, from the calibrated step model; and what `choose` costs.

For a closed loop of C requests over two partitioned servers, k on EAGLE and C-k on plain, the
steady state is analytic (calibration.md): each server's TPOT is its step time over its tokens
per step, output throughput is k/TPOT_e(k) + (C-k)/TPOT_p(C-k), and the TPOT median is the TPOT
of whichever server completes the median request (completions go as each server's throughput).

- greedy: each request joins the backend with the lower TPOT once it is added (the adaptive rule);
- system-optimal: the k that maximizes throughput (equivalently, minimizes token-weighted mean TPOT).

The sensitivity part asks what each rule does when its fitted slopes are off by +-30% while the
lines still pass through the measured operating point (which is what an online fit guarantees):
greedy compares two predictions one request away from measured points, the optimal split
depends on the slopes themselves.

Usage: python benchmarks/adaptive_rules.py [--out docs/benchmarks/adaptive-rules.md]
"""

from __future__ import annotations

import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from backends.sim.profiles import load_profile
from gateway.policies import Completion
from gateway.policies.adaptive import AdaptivePolicy
from gateway.pool.snapshot import BackendView, PoolSnapshot
from benchmarks.output import publish

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
EAGLE_CAP = 128


@dataclass(frozen=True)
class Line:
    alpha: float  # ms
    beta: float  # ms per request

    def at(self, n: float) -> float:
        return self.alpha + self.beta * n


def lines(profile_name: str) -> tuple[Line, Line]:
    profile = load_profile(profile_name)
    e, p = profile.eagle, profile.plain
    return Line(e.t0_ms / e.tau, e.per_request_ms / e.tau), Line(p.t0_ms, p.per_request_ms)


def outcome(eagle: Line, plain: Line, c: int, k: int) -> tuple[float, float]:
    """(output tok/s, TPOT p50 ms) with k of c requests on EAGLE."""
    parts = [(line.at(n), n / line.at(n) * 1000.0) for line, n in ((eagle, k), (plain, c - k)) if n > 0]
    throughput = sum(rate for _, rate in parts)
    half, acc = throughput / 2.0, 0.0
    for tpot, rate in sorted(parts):
        acc += rate
        if acc >= half:
            return throughput, tpot
    raise AssertionError("unreachable")


def greedy_split(eagle: Line, plain: Line, c: int) -> int:
    k = p = 0
    for _ in range(c):
        if k < EAGLE_CAP and eagle.at(k + 1) <= plain.at(p + 1):
            k += 1
        else:
            p += 1
    return k


def optimal_split(eagle: Line, plain: Line, c: int) -> int:
    return max(range(min(c, EAGLE_CAP) + 1), key=lambda k: outcome(eagle, plain, c, k)[0])


def tilted(line: Line, at: float, error: float) -> Line:
    """`line` with its slope off by `error`, still through the point at n = `at` (intercept kept
    positive, as the estimator does)."""
    level = line.at(at)
    beta = line.beta * (1.0 + error)
    alpha = max(level - beta * at, 0.02 * level)
    return Line(alpha, (level - alpha) / at if at > 0 else beta)


def comparison_table(profile: str) -> list[str]:
    eagle, plain = lines(profile)
    rows = [
        f"### {profile}",
        "",
        "| C | greedy: on EAGLE | tok/s | TPOT p50 ms | optimal: on EAGLE | tok/s | TPOT p50 ms | greedy tok/s vs optimal | greedy p50 vs optimal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in LEVELS:
        kg, ko = greedy_split(eagle, plain, c), optimal_split(eagle, plain, c)
        (tg, pg), (to, po) = outcome(eagle, plain, c, kg), outcome(eagle, plain, c, ko)
        rows.append(f"| {c} | {kg} | {tg:.0f} | {pg:.2f} | {ko} | {to:.0f} | {po:.2f} | {tg / to:.3f} | {pg / po:.3f} |")
    return rows


def sensitivity_table(profile: str) -> list[str]:
    eagle, plain = lines(profile)
    rows = [
        f"### {profile}: slopes fitted 30% off (lines through the true operating point)",
        "",
        "| C | rule | slope error | on EAGLE | tok/s, share of the true optimum | TPOT p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for c in (16, 64, 128):
        best = outcome(eagle, plain, c, optimal_split(eagle, plain, c))[0]
        for name, rule in (("greedy", greedy_split), ("optimal", optimal_split)):
            k_true = rule(eagle, plain, c)
            for error in (-0.3, 0.3):
                fitted_e, fitted_p = tilted(eagle, k_true, error), tilted(plain, c - k_true, -error)
                k = rule(fitted_e, fitted_p, c)
                throughput, p50 = outcome(eagle, plain, c, k)
                rows.append(f"| {c} | {name} | EAGLE {error:+.0%}, plain {-error:+.0%} | {k} | {throughput / best:.3f} | {p50:.2f} |")
    return rows


def choose_cost() -> tuple[float, float]:
    """Microseconds per `choose` (fitted, steady traffic) and per `observe`, one partitioned pair."""
    policy = AdaptivePolicy(probe_every=10**9)
    views: Callable[[int], PoolSnapshot] = lambda n: PoolSnapshot(  # noqa: E731
        (BackendView("eagle", True, True, n % 40), BackendView("plain", False, True, n % 90))
    )
    snapshots = [views(n) for n in range(1000)]
    for n in range(400):
        policy.routed(snapshots[n], policy.choose(snapshots[n]))
        policy.observe(Completion("eagle", 129, 0.01, 0.6, 1 + n % 30, 40.0))
        policy.observe(Completion("plain", 129, 0.01, 0.7, 1 + n % 60, 40.0))
    calls = 200_000
    choose = min(timeit.repeat(lambda: [policy.choose(s) for s in snapshots], number=calls // 1000, repeat=3))
    done = Completion("eagle", 129, 0.01, 0.6, 12.5, 40.0)
    observe = min(timeit.repeat(lambda: policy.observe(done), number=calls, repeat=3))
    return choose / calls * 1e6, observe / calls * 1e6


def group_choose_cost(groups: int = 8) -> float:
    """Microseconds per `choose` (fitted, steady traffic, a clock as the pool gives it)
    for `groups` co-located groups of an EAGLE and a plain server."""
    policy = AdaptivePolicy(probe_every=10**9, colocated=True)

    def snapshot(n: int) -> PoolSnapshot:
        views = []
        for g in range(groups):
            load = (n + 7 * g) % 24
            eagle = load if load < 12 else 0  # each group runs one mode
            views += [BackendView(f"e{g}", True, True, eagle, f"g{g}"), BackendView(f"p{g}", False, True, load - eagle, f"g{g}")]
        return PoolSnapshot(tuple(views), at=n * 0.01)

    snapshots = [snapshot(n) for n in range(1000)]
    for n in range(800):
        policy.routed(snapshots[n], policy.choose(snapshots[n]))
        load = 1 + n % 24
        policy.observe(Completion(f"e{n % groups}", 129, 0.01, 0.5 + 0.02 * load, load, load, token_chunks=43))
        policy.observe(Completion(f"p{n % groups}", 129, 0.01, 0.9 + 0.01 * load, load, load, token_chunks=128))
    calls = 20_000
    choose = min(timeit.repeat(lambda: [policy.choose(s) for s in snapshots], number=calls // 1000, repeat=3))
    return choose / calls * 1e6


@click.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write the Markdown here")
def main(out: Path | None) -> None:
    """Print (or write) the rule comparison and the decision cost."""
    choose_us, observe_us = choose_cost()
    groups_us = group_choose_cost()
    lines_out = [
        "# Adaptive routing: greedy per request vs system-optimal",
        "",
        f"Command: `python benchmarks/adaptive_rules.py{' --out ' + str(out) if out else ''}` "
        f"(analytic steady state of calibration.md's step model, partitioned, EAGLE cap {EAGLE_CAP}).",
        "",
        *comparison_table("field-8gpu"),
        "",
        *comparison_table("llama8b-h100"),
        "",
        *sensitivity_table("field-8gpu"),
        "",
        *sensitivity_table("llama8b-h100"),
        "",
        "## Cost of a decision",
        "",
        f"`AdaptivePolicy.choose`: {choose_us:.2f} us per call; `observe` (the fit): {observe_us:.2f} us per response "
        f"(Python {sys.version.split()[0]}, this machine, best of 3). With 8 co-located groups (the group rule, the "
        f"load forecast): `choose` {groups_us:.1f} us per call.",
        "",
    ]
    text = "\n".join(lines_out)
    publish(text, out)


if __name__ == "__main__":
    main()
