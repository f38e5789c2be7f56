"""`python -m loadtest sweep`: load levels against any OpenAI-compatible servers."""

from __future__ import annotations

from pathlib import Path

import click
import uvloop
from rich.console import Console

from loadtest.monitor import CpuMeter
from loadtest.options import (
    DEFAULT_CONCURRENCY,
    bad_parameter,
    parse_requests,
    parse_targets,
    sweep_options,
)
from loadtest.progress import progress_for
from loadtest.report import build_document, command_line, write_all
from loadtest.results import ResultsDocument
from loadtest.slip import SlipProbe
from loadtest.sweep import Sweep, SweepSettings, parse_levels
from loadtest.table import summary_table, table_console


@click.command()
@click.option("--target", "targets", multiple=True, required=True, metavar="NAME=URL",
              help="server to test (repeatable), e.g. specgate=http://127.0.0.1:8000")
@click.option("--concurrency", default=None, metavar="LIST", help=f"closed-loop levels [default: {DEFAULT_CONCURRENCY}]")
@click.option("--request-rate", default=None, metavar="LIST",
              help="open-loop Poisson arrival rates in requests/s (e.g. 1,2,4,inf) instead of closed-loop levels")
@click.option("--requests-per-level", default="4x", show_default=True, metavar="N|Nx",
              help="requests per level; 'Nx' means N per concurrency slot (N*C)")
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True, help="output tokens (exact: ignore_eos)")
@sweep_options
def sweep(
    targets: tuple[str, ...],
    concurrency: str | None,
    request_rate: str | None,
    requests_per_level: str,
    input_len: int,
    output_len: int,
    range_ratio: float,
    min_requests: int,
    stream: bool,
    api_key: str | None,
    warmup: int,
    endpoint: str,
    seed: int,
    timeout: float,
    out_dir: Path,
) -> None:
    """Sweep load levels against one or more OpenAI-compatible servers."""
    if concurrency is not None and request_rate is not None:
        raise click.UsageError("give either --concurrency (closed loop) or --request-rate (open loop), not both")
    try:
        levels = parse_levels(concurrency or (None if request_rate else DEFAULT_CONCURRENCY), request_rate)
    except ValueError as exc:
        raise bad_parameter("--request-rate" if request_rate else "--concurrency", exc) from None
    per_level = parse_requests(requests_per_level, 0 if request_rate is not None else min_requests)
    if request_rate is not None and per_level.per_slot:
        raise click.BadParameter("open-loop levels need an absolute count, not 'Nx'", param_hint="--requests-per-level")
    settings = SweepSettings(
        levels=levels, requests_per_level=per_level, input_len=input_len, output_len=output_len,
        range_ratio=range_ratio, stream=stream, endpoint=endpoint,  # type: ignore[arg-type]
        api_key=api_key, warmup=warmup, seed=seed, timeout=timeout,
    )
    parsed = parse_targets(targets)
    console = Console(stderr=True)

    async def run() -> ResultsDocument:
        # A target that is a simulator exports its schedule slip; for others the probe reads nothing.
        async with SlipProbe([t.url for t in parsed]) as slip:
            with progress_for(console) as progress:
                results = await Sweep(parsed, settings, progress, CpuMeter(), slip).run()
        return build_document("sweep", results, parsed, settings, command_line(click.get_current_context()))

    try:
        doc = uvloop.run(run())
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    write_all(doc, out_dir)
    table_console().print(summary_table(doc))
    console.print(f"wrote {out_dir}/results.json, results.csv, throughput.png, latency.png, report.md")
