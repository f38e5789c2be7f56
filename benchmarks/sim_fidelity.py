"""Benchmark: does the simulator reproduce its profiles' modelled throughput, role by role?

For each built-in profile and role a sim runs as its own process at a small time scale, and a closed
loop of C non-streaming clients (aiohttp) sends fixed-length completions (`max_tokens`=L,
`ignore_eos`) back to back for at least a second per level. The measured output throughput (sum of
the clients' own rates, converted back to time-scale 1) is compared with
`Profile.closed_loop_throughput`, which counts each request's joining (prefill) step and the
prefill of every cycle. The test suite asserts the same within 10% (tests/sim/test_sim_fidelity.py).

    python benchmarks/sim_fidelity.py --out docs/benchmarks/sim-fidelity.md
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import click
import uvloop
from rich.console import Console

from backends.sim.profiles import BUILTIN_PROFILES, ROLES, Role, load_profile
from backends.sim.tokenizer import count_tokens
from backends.testbed import start_sim
from benchmarks.output import publish
from loadtest.steady_rate import PROMPT_16 as PROMPT
from loadtest.steady_rate import closed_loop

LEVELS = (1, 2, 8, 32, 128)


def levels_for(cap: int) -> list[int]:
    """The levels up to the role's running cap, and the cap itself: beyond it clients only queue,
    and a closed loop whose clients wait different times has no common steady rate to compare."""
    return sorted({c for c in LEVELS if c <= cap} | {min(cap, max(LEVELS))})


def measure(
    profile_name: str, role: Role, time_scale: float, output_tokens: int, workdir: Path
) -> list[tuple[int, float, float]]:
    """(concurrency, modelled tok/s, measured tok/s) per level, at time-scale 1."""
    profile = load_profile(profile_name)
    log = workdir / f"fidelity-{profile_name}-{role}.log"
    sim = start_sim("--role", role, "--profile", profile_name, "--time-scale", str(time_scale), timeout=30, log_path=log)
    rows = []
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for concurrency in levels_for(profile.role(role).max_running_requests):
                loop = runner.run(closed_loop(sim.url(), concurrency, output_tokens, min_seconds=1.0))
                measured = loop.output_tok_s * time_scale
                modelled = profile.closed_loop_throughput(role, concurrency, output_tokens, count_tokens(PROMPT))
                rows.append((concurrency, modelled, measured))
    finally:
        sim.stop(timeout=15)
    return rows


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--time-scale", type=float, default=0.1, show_default=True)
@click.option("--output-tokens", type=int, default=256, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="write the markdown report here")
@click.option(
    "--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("/tmp/sim-fidelity"), show_default=True
)
def main(time_scale: float, output_tokens: int, out: Path | None, workdir: Path) -> None:
    """Measured against modelled closed-loop throughput for every built-in profile and role."""
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console()
    lines = [
        "# Simulator fidelity: measured against modelled throughput",
        "",
        f"Command: `{shlex.join(['python', 'benchmarks/sim_fidelity.py', *sys.argv[1:]])}`",
        "",
        (
            f"One sim process per profile and role at time-scale {time_scale:g}, closed loop of C non-streaming "
            f"clients, L={output_tokens} output tokens, {count_tokens(PROMPT)} prompt tokens, at least 1 s per level; "
            "tok/s converted back to time-scale 1. Modelled = `Profile.closed_loop_throughput`. Levels stop at each "
            "role's running cap (48 for EAGLE). `h200-llama8b` is the profile measured on an H200 "
            "(`backends/sim/measured/h200-llama8b.toml`): its step times are piecewise-linear `step_ms` tables."
        ),
        "",
        "| profile | role | C | modelled tok/s | measured tok/s | measured / modelled |",
        "|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for profile_name in sorted(BUILTIN_PROFILES):
        for role in ROLES:
            for concurrency, modelled, measured in measure(profile_name, role, time_scale, output_tokens, workdir):
                ratio = measured / modelled
                worst = max(worst, abs(ratio - 1))
                console.print(f"{profile_name} {role} C={concurrency}: {measured:.0f} vs {modelled:.0f} ({ratio:.3f})")
                lines.append(
                    f"| {profile_name} | {role} | {concurrency} | {modelled:.1f} | {measured:.1f} | {ratio:.3f} |"
                )
    lines += ["", f"Largest deviation: {worst:.1%}."]
    text = "\n".join(lines) + "\n"
    publish(text, out)


if __name__ == "__main__":
    main()
