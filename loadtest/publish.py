"""Regenerate the envelope reports committed under docs/benchmarks/ (one command, run one after another).

    python -m loadtest.publish [--out docs/benchmarks] [--only NAME ...]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click

LEVELS = "1,2,4,8,16,32,64,128"
BOUNDS = ("--min-throughput-ratio", "0.95", "--max-tpot-ratio", "1.05")

# name -> envelope arguments. field-8gpu: EAGLE pays only for a lone request, so the default
# threshold policy (threshold 1). llama8b-h100: EAGLE wins up to its 48-request cap, so spill at 48.
# field-8gpu with spill: EAGLE's GPUs add throughput under load when it keeps a small batch.
RUNS: dict[str, tuple[str, ...]] = {
    "envelope-field-8gpu": ("--profile", "field-8gpu", *BOUNDS),
    "envelope-llama8b-h100": ("--profile", "llama8b-h100", "--policy", "spill",
                              "--policy-param", "eagle_max_inflight=48", *BOUNDS),
    "envelope-field-8gpu-spill": ("--profile", "field-8gpu", "--policy", "spill", "--policy-param", "eagle_max_inflight=8"),
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
