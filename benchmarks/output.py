"""Where a benchmark's markdown report goes (stdout, and `--out` when given), and what ran it."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def publish(text: str, out: Path | None) -> None:
    """Print the report and, when `out` is set, write it there (creating its directory)."""
    click.echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def run_outputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a benchmark whose envelopes run in real time: `out` (the report), `raw` (each run's
    results.json copied there), `work_dir` (the envelopes' outputs kept there) and `reuse` (results
    already there taken as they are)."""
    options = (
        click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write the report here"),
        click.option("--raw", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="copy each real-time run's results.json here"),
        click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="keep the envelopes' outputs here [default: a temporary directory]"),
        click.option("--reuse", is_flag=True, help="use real-time results already in --work-dir"),
    )
    for option in reversed(options):
        fn = option(fn)
    return fn


def interpreter() -> str:
    """This process's Python, as a report names it: version, the binary behind the venv, how libpython is linked.

    The build matters to every number a Python process measures: on this machine pyenv's default build
    (shared libpython, no PGO or LTO) spends about a third more per relayed chunk in the relay's own code
    than Debian's packaged python3.11 (static, PGO and LTO) (docs/benchmarks/relay-cost.md).
    """
    with open("/proc/self/maps") as maps:
        shared = any("libpython" in line for line in maps)
    linked = "shared libpython" if shared else "static libpython"
    return f"{platform.python_implementation()} {platform.python_version()}, {os.path.realpath(sys.executable)}, {linked}"


if __name__ == "__main__":  # benchmarks/gateway_ab.py asks each checkout's venv this way
    print(interpreter())
