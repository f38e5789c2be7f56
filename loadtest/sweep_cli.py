"""`python -m loadtest sweep`: load levels against any OpenAI-compatible servers."""

from __future__ import annotations

from pathlib import Path

import click
import uvloop
from rich.console import Console

from loadtest.cache_flush import CacheFlush
from loadtest.monitor import CpuMeter
from loadtest.options import DEFAULT_CONCURRENCY, parse_targets, sweep_options
from loadtest.progress import progress_for
from loadtest.report import build_document, command_line, write_all
from loadtest.results import ResultsDocument
from loadtest.slip import SlipProbe
from loadtest.sweep import Sweep, SweepSettings
from loadtest.table import summary_table, table_console
from loadtest.workload_options import RATE_HELP, REQUESTS_HELP, WorkloadChoice, workload_options


@click.command()
@click.option("--target", "targets", multiple=True, required=True, metavar="NAME=URL",
              help="server to test (repeatable), e.g. specgate=http://127.0.0.1:8000")
@click.option("--concurrency", default=None, metavar="LIST", help=f"closed-loop levels [default: {DEFAULT_CONCURRENCY}]")
@click.option("--request-rate", default=None, metavar="LIST", help=RATE_HELP)
@click.option("--requests-per-level", default=None, metavar="N|Nx", help=REQUESTS_HELP)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True, help="output tokens (exact: ignore_eos)")
@click.option("--flush-cache", is_flag=True,
              help="before each target runs each level, POST /flush_cache to every target (a gateway flushes its "
                   "backends), so no target finds prompts an earlier one sent still cached on servers they share")
@sweep_options
@workload_options
def sweep(
    targets: tuple[str, ...],
    concurrency: str | None,
    request_rate: str | None,
    requests_per_level: str | None,
    input_len: int,
    output_len: int,
    flush_cache: bool,
    min_requests: int,
    stream: bool,
    api_key: str | None,
    warmup: int,
    endpoint: str,
    seed: int,
    timeout: float,
    out_dir: Path,
    workload: WorkloadChoice,
) -> None:
    """Sweep load levels against one or more OpenAI-compatible servers."""
    levels = workload.levels(concurrency, request_rate, DEFAULT_CONCURRENCY)
    per_level = workload.requests(requests_per_level, min_requests, levels)
    if workload.slo.tpot_ms is not None and not stream:
        raise click.UsageError("--slo-tpot-ms needs streamed responses (TPOT is not measured with --no-stream)")
    settings = SweepSettings(
        levels=levels, requests_per_level=per_level, input_len=input_len, output_len=output_len,
        stream=stream, endpoint=endpoint,  # type: ignore[arg-type]
        api_key=api_key, warmup=warmup, seed=seed, timeout=timeout, **workload.settings(),
    )
    parsed = parse_targets(targets)
    console = Console(stderr=True)

    async def run() -> ResultsDocument:
        # A target that is a simulator exports its schedule slip; for others the probe reads nothing.
        async with SlipProbe([t.url for t in parsed]) as slip, CacheFlush([t.url for t in parsed], api_key=api_key) as flush:
            with progress_for(console) as progress:
                results = await Sweep(parsed, settings, progress, CpuMeter(), slip, flush if flush_cache else None).run()
        return build_document("sweep", results, parsed, settings, command_line(click.get_current_context()))

    try:
        doc = uvloop.run(run())
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    write_all(doc, out_dir)
    table_console().print(summary_table(doc))
    console.print(f"wrote {out_dir}/results.json, results.csv, throughput.png, latency.png, report.md")
