"""What a priority lane can buy on a profile's step-time model: every EAGLE/plain split of one level.

Partitioned EAGLE and plain servers (as docs/benchmarks/service-tiers.md runs them) hold C requests
between them in a closed loop. Priority requests ride the EAGLE server, so their TPOT is EAGLE's at
the batch the split leaves it, `step_ms(B) / tau`; the node's decode throughput is
`B_e / TPOT_e(B_e) + B_p / TPOT_p(B_p)`. For each split this prints the priority TPOT and the
throughput as ratios to the untiered split (`--untiered-eagle` requests on EAGLE: all C unless
given, as the adaptive policy routes llama8b-h100 at C=32), and the two numbers issue 14's bars
need: the best priority ratio with throughput >= 0.97x, and the throughput at priority ratio 0.8x.
Decode only (prefill and the arrival pattern are left out): a model of the level, not a measurement.

Usage: python benchmarks/tier_frontier.py --profile llama8b-h100 --concurrency 32 [--out F]
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from backends.sim.profiles import RoleProfile, load_profile
from benchmarks.output import publish

PRIORITY_BAR = 0.8
THROUGHPUT_BAR = 0.97


def tpot_ms(role: RoleProfile, batch: int) -> float:
    """Modelled ms per output token of one request in a batch of `batch`."""
    return role.step_ms(batch) / role.tokens_per_step(batch)


def splits(eagle: RoleProfile, plain: RoleProfile, concurrency: int, untiered: int) -> list[tuple[int, float, float]]:
    """(requests on EAGLE, priority TPOT ratio, throughput ratio) for every split with EAGLE busy."""

    def throughput(on_eagle: int) -> float:
        on_plain = concurrency - on_eagle
        total = on_eagle / tpot_ms(eagle, on_eagle) if on_eagle else 0.0
        return total + (on_plain / tpot_ms(plain, on_plain) if on_plain else 0.0)

    ref_tpot, ref_throughput = tpot_ms(eagle, untiered), throughput(untiered)
    return [(b, tpot_ms(eagle, b) / ref_tpot, throughput(b) / ref_throughput) for b in range(1, concurrency + 1)]


def report(profile: str, concurrency: int, untiered: int, rows: list[tuple[int, float, float]]) -> str:
    """The split table and the frontier's two numbers, as Markdown."""
    feasible = [r for r in rows if r[2] >= THROUGHPUT_BAR]
    best = min(feasible, key=lambda r: r[1])
    at_bar = max((r for r in rows if r[1] <= PRIORITY_BAR), key=lambda r: r[2], default=None)
    lines = [
        f"# Priority lane frontier: {profile}, C={concurrency}, partitioned EAGLE + plain (model)",
        "",
        f"Command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`",
        "",
        f"Untiered: {untiered} of {concurrency} requests on EAGLE. Ratios are to that split; decode only.",
        "",
        f"- Best priority TPOT ratio with throughput >= {THROUGHPUT_BAR}x: **{best[1]:.3f}** ({best[0]} on EAGLE, throughput {best[2]:.3f}x).",
    ]
    if at_bar is not None:
        lines.append(
            f"- Best throughput with priority TPOT ratio <= {PRIORITY_BAR}x: **{at_bar[2]:.3f}x** ({at_bar[0]} on EAGLE, ratio {at_bar[1]:.3f})."
        )
    else:
        lines.append(f"- No split reaches a priority TPOT ratio of {PRIORITY_BAR}x.")
    lines += ["", "| on EAGLE | on plain | priority TPOT ratio | throughput ratio |", "|---|---|---|---|"]
    lines += [f"| {b} | {concurrency - b} | {p:.3f} | {t:.3f} |" for b, p, t in rows]
    return "\n".join(lines) + "\n"


@click.command(help=__doc__)
@click.option("--profile", default="llama8b-h100", show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--untiered-eagle", type=click.IntRange(min=1), default=None, help="requests on EAGLE untiered [all]")
@click.option("--out", type=click.Path(path_type=Path), default=None)
def main(profile: str, concurrency: int, untiered_eagle: int | None, out: Path | None) -> None:
    model = load_profile(profile)
    untiered = min(untiered_eagle or concurrency, concurrency)
    publish(report(profile, concurrency, untiered, splits(model.eagle, model.plain, concurrency, untiered)), out)


if __name__ == "__main__":
    main()
