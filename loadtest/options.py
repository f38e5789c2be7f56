"""Command-line options and parsers shared by `sweep` and `envelope`."""

from __future__ import annotations

from pathlib import Path

import click

from loadtest.sweep import Target

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128"


def bad_parameter(param: str, exc: ValueError) -> click.BadParameter:
    """A click usage error naming the option that was wrong."""
    return click.BadParameter(str(exc), param_hint=param)


def parse_targets(values: tuple[str, ...]) -> list[Target]:
    """`--target NAME=URL` values as targets (click error on bad input)."""
    try:
        targets = [Target.parse(v) for v in values]
    except ValueError as exc:
        raise bad_parameter("--target", exc) from None
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise click.BadParameter(f"target names must be unique, got {names}", param_hint="--target")
    return targets


def sweep_options(func: click.decorators.FC) -> click.decorators.FC:
    """Options shared by `sweep` and `envelope` that shape the requests."""
    options = [
        click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True, help="prompt tokens"),
        click.option("--stream/--no-stream", default=True, show_default=True),
        click.option("--api-key", default=None, help="sent as Authorization: Bearer KEY"),
        click.option("--min-requests-per-level", "min_requests", type=click.IntRange(min=0), default=16, show_default=True,
                     help="never fewer requests than this at a level (steadier medians at low concurrency)"),
        click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
                     help="warm-up requests per target before the first level (not measured)"),
        click.option("--endpoint", type=click.Choice(["chat", "completions"]), default="chat", show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--timeout", type=click.FloatRange(min=1.0), default=600.0, show_default=True,
                     help="seconds one request may take"),
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
                     help="directory for results.json, results.csv, the plots and report.md"),
    ]
    for option in reversed(options):
        func = option(func)
    return func
