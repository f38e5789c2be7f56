"""Service tiers under mixed traffic: what priority requests gain, and what the node pays for it.

For each profile, two fresh simulated stacks (`specgate serve --config ...`, partitioned EAGLE and
plain servers, the adaptive policy with its defaults, as `python -m loadtest envelope --compare
single` starts them) get the identical closed-loop traffic at each level: the same prompts, in
the same order, with every tenth request marked. The first stack gets the marked requests
untiered (today's routing), the second sends them with `x-specgate-service-tier: priority`. The
report compares the marked requests' TPOT p50 and TTFT p50 between the two, and the level's
total output throughput. Target (issue 14): priority TPOT p50 <= 0.8x, throughput >= 0.97x.

Usage:
  python benchmarks/service_tiers.py --out docs/benchmarks/service-tiers.md
"""

from __future__ import annotations

import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import uvloop

from benchmarks.gateway_stack import GatewayStack
from benchmarks.output import publish
from gateway.tiers import TIER_HEADER
from loadtest.client import TargetClient, TargetOptions, open_session, served_model
from loadtest.envelope.harness import Ports, StackSettings
from loadtest.envelope.timescale import auto_time_scale, profile_for
from loadtest.load import closed_loop
from loadtest.prompts import PromptFactory
from loadtest.records import LevelRun, RequestRecord, RequestSpec
from loadtest.stats import output_tokens, request_tpot

# Levels where the partitioned servers share the load (field-8gpu's crossover is about 1.7 in
# flight; llama8b-h100's EAGLE server reaches its plain server's idle TPOT at about 51).
LEVELS = {"field-8gpu": (8, 16, 32), "llama8b-h100": (32, 64, 128)}
EVERY = 10  # one request in EVERY is marked (priority in the tiered run)
TPOT_TARGET, THROUGHPUT_TARGET = 0.8, 0.97


@dataclass(frozen=True)
class Outcome:
    """One level of one run: the marked and the other requests' medians (ms), throughput (tok/s)."""

    marked_tpot: float
    marked_ttft: float
    other_tpot: float
    throughput: float
    marked_on_eagle: float
    other_on_eagle: float
    errors: int


def level_specs(concurrency: int, requests: int, seed: int, input_len: int, output_len: int) -> list[RequestSpec]:
    """The level's requests, the same for both runs."""
    return list(PromptFactory(input_len, output_len, seed=seed * 1000 + concurrency).take(requests))


def summarize(run: LevelRun, marked: set[int]) -> Outcome:
    """Medians of the marked requests (`marked`: their records' ids) and the others, and the level's throughput."""
    ok = [(r, id(r) in marked) for r in run.records if r.ok]

    def median(values: list[float | None]) -> float:
        present = [v for v in values if v is not None]
        return 1000.0 * statistics.median(present) if present else float("nan")

    def on_eagle(group: list[Any]) -> float:
        return sum(r.backend == "eagle" for r in group) / max(len(group), 1)

    mine = [r for r, m in ok if m]
    rest = [r for r, m in ok if not m]
    return Outcome(
        marked_tpot=median([request_tpot(r) for r in mine]),
        marked_ttft=median([r.ttft for r in mine]),
        other_tpot=median([request_tpot(r) for r in rest]),
        throughput=sum(output_tokens(r) for r, _ in ok) / run.duration,
        marked_on_eagle=on_eagle(mine),
        other_on_eagle=on_eagle(rest),
        errors=len(run.records) - len(ok),
    )


async def run_stack(
    profile: str, scale: float, seed: int, levels: tuple[int, ...], tiered: bool, args: dict[str, int], work: Path
) -> dict[int, Outcome]:
    """Every level through one fresh stack; marked requests as priority when `tiered`."""
    outcomes: dict[int, Outcome] = {}
    stack_settings = StackSettings(profile, None, "partitioned", "adaptive", {}, scale, seed)
    async with GatewayStack(stack_settings, Ports.pick("partitioned"), work) as stack, open_session(max(levels) + 8, 3600.0) as session:
        model = await served_model(session, stack.url, None)
        default = TargetClient(session, stack.url, model, TargetOptions())
        priority = TargetClient(session, stack.url, model, TargetOptions(headers=((TIER_HEADER, "priority"),)))
        warmup = list(PromptFactory(args["input_len"], args["output_len"], seed=seed - 1).take(4 * levels[0]))
        await closed_loop(default.send, warmup, concurrency=levels[0])  # the fits learn before anything is measured
        for c in levels:
            specs = level_specs(c, max(args["per_slot"] * c, args["min_requests"]), seed, args["input_len"], args["output_len"])
            marked = {spec for i, spec in enumerate(specs) if i % EVERY == EVERY // 2}
            use = priority if tiered else default

            sent: set[int] = set()

            async def send(spec: RequestSpec, use: TargetClient = use, marked: set[RequestSpec] = marked, sent: set[int] = sent) -> RequestRecord:
                if spec not in marked:
                    return await default.send(spec)
                record = await use.send(spec)
                sent.add(id(record))
                return record

            outcomes[c] = summarize(await closed_loop(send, specs, c), sent)
            click.echo(f"  {profile} {'tiered' if tiered else 'untiered'} C={c}: {outcomes[c]}", err=True)
    return outcomes


def report(results: dict[str, tuple[float, dict[int, Outcome], dict[int, Outcome]]], command: str, args: dict[str, int]) -> str:
    """The markdown report."""
    lines = [
        "# Service tiers under mixed traffic",
        "",
        f"One request in {EVERY} is priority; the rest are untiered. Each level runs twice on fresh, identical stacks "
        "(partitioned EAGLE + plain simulated servers, adaptive policy with its defaults, `tier_priority_headroom` "
        "0.35): once with those requests untiered, once with `x-specgate-service-tier: priority`. Closed loop, "
        f"{args['input_len']} input / {args['output_len']} output tokens, {args['per_slot']} requests per slot "
        f"(at least {args['min_requests']}) per level, after a warm-up. Target: priority TPOT p50 <= {TPOT_TARGET}x "
        f"what the same requests get untiered, total throughput >= {THROUGHPUT_TARGET}x.",
        "",
        "    " + command,
        "",
    ]
    for profile, (scale, untiered, tiered) in results.items():
        lines += [
            f"## {profile} (time scale {scale:g}; absolute numbers are wall-clock at that scale, ratios do not depend on it)",
            "",
            "| C | priority TPOT p50 ms untiered | tiered | ratio | priority TTFT p50 ms untiered | tiered | "
            "default TPOT p50 ms untiered | tiered | tok/s untiered | tiered | ratio | priority on EAGLE | default on EAGLE untiered / tiered | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c, base in untiered.items():
            t = tiered[c]
            tpot_ratio, thr_ratio = t.marked_tpot / base.marked_tpot, t.throughput / base.throughput
            ok = "" if tpot_ratio <= TPOT_TARGET and thr_ratio >= THROUGHPUT_TARGET else " (missed)"
            lines.append(
                f"| {c} | {base.marked_tpot:.2f} | {t.marked_tpot:.2f} | {tpot_ratio:.3f}{ok} | {base.marked_ttft:.1f} | "
                f"{t.marked_ttft:.1f} | {base.other_tpot:.2f} | {t.other_tpot:.2f} | {base.throughput:.0f} | "
                f"{t.throughput:.0f} | {thr_ratio:.3f} | {t.marked_on_eagle:.0%} | {base.other_on_eagle:.0%} / "
                f"{t.other_on_eagle:.0%} | {base.errors + t.errors} |"
            )
        lines.append("")
    return "\n".join(lines)


@click.command()
@click.option("--profile", "profiles", multiple=True, type=click.Choice(sorted(LEVELS)), help="default: both")
@click.option("--scale-factor", type=float, default=2.0, show_default=True,
              help="time scale = this x the envelope's auto scale for the levels (room for a shared machine)")
@click.option("--per-slot", type=click.IntRange(min=1), default=8, show_default=True, help="requests per level per slot")
@click.option("--min-requests", type=click.IntRange(min=EVERY), default=240, show_default=True)
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=Path("/tmp/specgate-service-tiers"),
              show_default=True, help="configs and gateway logs")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(
    profiles: tuple[str, ...], scale_factor: float, per_slot: int, min_requests: int, input_len: int, output_len: int,
    seed: int, work: Path, out: Path | None,
) -> None:
    """Priority requests' TPOT and TTFT with and without tiers, and the node's throughput."""
    args = {"per_slot": per_slot, "min_requests": min_requests, "input_len": input_len, "output_len": output_len}
    results: dict[str, tuple[float, dict[int, Outcome], dict[int, Outcome]]] = {}
    for profile in profiles or tuple(LEVELS):
        levels = LEVELS[profile]
        scale = round(scale_factor * auto_time_scale(profile_for(profile, None), levels)[0], 2)
        untiered = uvloop.run(run_stack(profile, scale, seed, levels, False, args, work / profile / "untiered"))
        tiered = uvloop.run(run_stack(profile, scale, seed, levels, True, args, work / profile / "tiered"))
        results[profile] = (scale, untiered, tiered)
    command = "python benchmarks/service_tiers.py " + shlex.join(sys.argv[1:])
    publish(report(results, command.strip(), args), out)


if __name__ == "__main__":
    main()
