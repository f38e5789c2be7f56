"""Regenerate the envelope reports committed under docs/benchmarks/ (one command, run one after another).

    python -m benchmarks.publish [--out docs/benchmarks] [--only NAME ...]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click

LEVELS = "1,2,4,8,16,32,64,128"
BOUNDS = ("--min-throughput-ratio", "0.95", "--max-tpot-ratio", "1.05")

ADAPTIVE = ("--policy", "adaptive", "--requests-per-level", "8x", "--min-requests-per-level", "32")
ADAPTIVE_BOUNDS = ("--min-throughput-ratio", "0.97", "--max-tpot-ratio", "1.03")
# The reports below compare specgate with the two servers it routes to: `--compare single`. The
# same-hardware reports (`envelope-same-hw-*`) compare it with the same GPUs run each other way, at
# the default bounds (0.97 / 1.03), sized to about 10 minutes each on the 2-core machine.
SINGLE = ("--compare", "single")

# name -> envelope arguments. The fixed rules need a parameter per profile: field-8gpu's EAGLE
# pays only for a lone request (threshold 1); llama8b-h100's EAGLE wins up to its 48-request cap
# (spill at 48); spill at 8 shows EAGLE's GPUs adding throughput under load. The adaptive policy
# (the default) runs with no parameter, and colocated adds the single adaptive-speculation server.
RUNS: dict[str, tuple[str, ...]] = {
    "envelope-same-hw-llama8b-h100-k8": ("--profile", "llama8b-h100", "--groups", "8", "--gpus-per-group", "1",
                                         "--requests-per-level", "2x", "--min-requests-per-level", "8"),
    "envelope-same-hw-field-8gpu-k1": ("--profile", "field-8gpu", "--groups", "1", "--gpus-per-group", "8"),
    "envelope-field-8gpu": (*SINGLE, "--profile", "field-8gpu", "--policy", "threshold", *BOUNDS),
    "envelope-llama8b-h100": (*SINGLE, "--profile", "llama8b-h100", "--policy", "spill",
                              "--policy-param", "eagle_max_inflight=48", *BOUNDS),
    "envelope-field-8gpu-spill": (*SINGLE, "--profile", "field-8gpu", "--policy", "spill",
                                  "--policy-param", "eagle_max_inflight=8"),
    "envelope-field-8gpu-adaptive": (*SINGLE, "--profile", "field-8gpu", *ADAPTIVE, *ADAPTIVE_BOUNDS),
    "envelope-llama8b-h100-adaptive": (*SINGLE, "--profile", "llama8b-h100", *ADAPTIVE, *ADAPTIVE_BOUNDS),
    "envelope-field-8gpu-colocated-adaptive": (*SINGLE, "--profile", "field-8gpu", "--topology", "colocated", *ADAPTIVE),
    "envelope-llama8b-h100-colocated-adaptive": (*SINGLE, "--profile", "llama8b-h100", "--topology", "colocated",
                                                 *ADAPTIVE),
}


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("docs/benchmarks"), show_default=True)
@click.option("--only", multiple=True, type=click.Choice(sorted(RUNS)), help="run just these reports")
def main(out_dir: Path, only: tuple[str, ...]) -> None:
    """Run every envelope report; exit 1 if any run failed or missed its bounds."""
    failed = []
    for name in only or tuple(RUNS):
        target = out_dir / name
        argv = [sys.executable, "-m", "loadtest", "envelope", *RUNS[name], "--concurrency", LEVELS, "--out", str(target)]
        click.echo(f"== {name}: {' '.join(argv[1:])}", err=True)
        code = subprocess.call(argv)
        if code == 0:
            shutil.rmtree(target / "logs", ignore_errors=True)  # process logs are for debugging, not the report
        else:
            failed.append(f"{name} (exit {code})")
    if failed:
        raise click.ClickException("not clean: " + ", ".join(failed))


if __name__ == "__main__":
    main()
