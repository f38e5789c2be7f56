"""`python -m vnode`: `envelope` (one profile's same-hardware envelope in virtual time), `family` (the profile
family's sweep), `family-compare` (two sweeps' verdicts and ratios side by side) and `family-ceiling` (what
one fixed mode per level reaches on specgate's layout)."""

from __future__ import annotations

import os
from collections.abc import Callable
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

import click
from rich.console import Console

from loadtest.envelope.cli import (
    DEFAULT_LEVELS,
    DEFAULT_MAX_TPOT_RATIO,
    DEFAULT_MIN_THROUGHPUT_RATIO,
    chosen_profile,
    parse_policy_params,
    sweep_settings,
)
from loadtest.envelope.comparison import FAILED, Bound, check_text, envelope_markdown
from loadtest.envelope.baselines import MODES, ROUTER_CHOICES, SMG_SUFFIX, default_router_choice
from loadtest.envelope.fair import SUBJECT, Hardware
from loadtest.options import bad_parameter
from loadtest.progress import progress_for
from loadtest.report import command_line, write_all
from loadtest.table import summary_table, table_console
from loadtest.workload_options import RATE_HELP, REQUESTS_HELP, WorkloadChoice, workload_options
from vnode.ceiling import run_ceiling
from vnode.ceiling_report import ceiling_json, ceiling_markdown, level_text, verdict
from vnode.envelope import EnvelopeSpec, run_envelope
from vnode.family import Member, family, members
from vnode.family_compare import THRESHOLD, compare, comparison_lines, load_cells
from vnode.family_report import cells_json, failures_text, family_markdown, family_table
from vnode.family_sweep import WORKLOADS, Scale, run_family
from vnode.smg_router import SmgSettings

PROGRAM = "python -m vnode"
TARGETS = (*MODES, *(mode + SMG_SUFFIX for mode in MODES), SUBJECT)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A node of simulated SGLang servers in virtual time: envelopes and the profile family in seconds."""


@main.command()
@click.option("--profile", default=None, help="built-in simulator profile")
@click.option("--profile-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="simulator profile file (TOML or JSON), laid over --profile (default: field-8gpu)")
@click.option("--groups", type=click.IntRange(min=1), default=1, show_default=True,
              help="K, the GPU groups (specgate) and data-parallel replicas (baselines)")
@click.option("--gpus-per-group", type=click.IntRange(min=1), default=None,
              help="G, the GPUs of each group or replica [default: the profile's num_gpus]")
@click.option("--eagle-mem-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="specgate's EAGLE server's share of its group's GPU memory [default: the launcher's]")
@click.option("--plain-mem-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="specgate's plain server's share of its group's GPU memory [default: the launcher's]")
@click.option("--policy", default="adaptive", show_default=True, help="gateway routing policy")
@click.option("--policy-param", "policy_params", multiple=True, metavar="KEY=VALUE",
              help="policy parameter (repeatable), e.g. adaptive_probe_every=400")
@click.option("--concurrency", default=None, metavar="LIST", help=f"closed-loop levels [default: {DEFAULT_LEVELS}]")
@click.option("--request-rate", default=None, metavar="LIST", help=RATE_HELP)
@click.option("--requests-per-level", default=None, metavar="N|Nx", help=REQUESTS_HELP)
@click.option("--min-requests-per-level", "min_requests", type=click.IntRange(min=0), default=16, show_default=True,
              help="never fewer requests than this at a level")
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--min-throughput-ratio", type=click.FloatRange(min=0.0), default=DEFAULT_MIN_THROUGHPUT_RATIO,
              show_default=True, help="fail unless specgate tok/s >= R x the best baseline at every level")
@click.option("--max-tpot-ratio", type=click.FloatRange(min=0.0), default=DEFAULT_MAX_TPOT_RATIO, show_default=True,
              help="fail unless specgate TPOT p50 <= R x the best baseline that carries the load at every level")
@click.option("--max-ttft-p50-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate TTFT p50 <= R x the lowest carrying baseline's at every level")
@click.option("--max-e2e-p50-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate E2E p50 <= R x the lowest carrying baseline's at every level")
@click.option("--max-e2e-p99-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate E2E p99 <= R x the lowest carrying baseline's at every level")
@click.option("--no-failed", is_flag=True, default=False, help="fail a level where any target failed a request")
@click.option("--draws", type=click.Choice(["server", "request"]), default="server", show_default=True,
              help="acceptance draws: each server's own stream (the simulator's), or each request's own sequence, the "
                   "same on every target (common random numbers: targets that route alike give the same numbers)")
@click.option("--hop-ms", "hop_texts", multiple=True, metavar="[TARGET=]MS",
              help="model ms between the clients and a target's servers, each way (repeatable; no target: every one) "
                   "[default: 0]")
@click.option("--baseline-router", type=click.Choice(list(ROUTER_CHOICES)), default=None,
              help="K > 1: what routes each baseline's K servers: least-inflight (the balancer), smg-cache-aware (an "
                   "emulation of SMG 1.13.0's cache_aware policy: targets plain-dp+smg, ...) or both [default: both for "
                   "--dataset shared-prefix, multi-turn and trace, else least-inflight]")
@click.option("--smg-load-interval", type=click.FloatRange(min=0.0, min_open=True), default=SmgSettings.load_interval,
              show_default=True, help="model seconds between the emulated SMG's load polls (SMG's 10 wall seconds over "
                                      "a real-time run's time scale)")
@click.option("--taught", is_flag=True,
              help="a what-if: specgate's policy starts knowing every server's curve at the workload's lengths "
                   "(an open loop's steady state), as if it had served every load before")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write results.json, results.csv, the plots and report.md here")
@workload_options
def envelope(
    profile: str | None,
    profile_file: Path | None,
    groups: int,
    gpus_per_group: int | None,
    eagle_mem_fraction: float | None,
    plain_mem_fraction: float | None,
    policy: str,
    policy_params: tuple[str, ...],
    concurrency: str | None,
    request_rate: str | None,
    requests_per_level: str | None,
    min_requests: int,
    input_len: int,
    output_len: int,
    warmup: int,
    seed: int,
    min_throughput_ratio: float,
    max_tpot_ratio: float,
    max_ttft_p50_ratio: float | None,
    max_e2e_p50_ratio: float | None,
    max_e2e_p99_ratio: float | None,
    no_failed: bool,
    draws: Literal["server", "request"],
    hop_texts: tuple[str, ...],
    baseline_router: str | None,
    smg_load_interval: float,
    taught: bool,
    out_dir: Path | None,
    workload: WorkloadChoice,
) -> None:
    """specgate against the same GPUs run each other way, in virtual time (the model of `python -m loadtest envelope`)."""
    params = parse_policy_params(policy_params)
    settings = sweep_settings(workload, concurrency, request_rate, requests_per_level, min_requests, input_len,
                              output_len, warmup, seed)
    model = chosen_profile(profile, profile_file)
    hardware = Hardware(groups, gpus_per_group or model.num_gpus, eagle_mem_fraction, plain_mem_fraction)
    if hardware.groups * hardware.gpus_per_group > model.node_gpus:
        raise click.UsageError(f"--groups {groups} x --gpus-per-group {hardware.gpus_per_group} needs "
                               f"{groups * hardware.gpus_per_group} GPUs; the profile's node has {model.node_gpus}")
    limits: tuple[tuple[str, Literal[">=", "<="], float | None], ...] = (
        ("throughput_ratio", ">=", min_throughput_ratio), ("tpot_ratio", "<=", max_tpot_ratio),
        ("ttft_p50_ratio", "<=", max_ttft_p50_ratio), ("e2e_p50_ratio", "<=", max_e2e_p50_ratio),
        ("e2e_p99_ratio", "<=", max_e2e_p99_ratio), (FAILED, "<=", 0.0 if no_failed else None),
    )
    bounds = tuple(Bound(name, op, value) for name, op, value in limits if value is not None)
    try:
        hops = _hops(hop_texts)
    except ValueError as exc:
        raise bad_parameter("--hop-ms", exc) from None
    if baseline_router not in (None, "least-inflight") and groups == 1:
        raise click.UsageError(f"--baseline-router {baseline_router}: with --groups 1 each baseline is one server, "
                               "called directly; a router needs K > 1 replicas to choose between")
    routers = ROUTER_CHOICES[baseline_router or default_router_choice(workload.dataset.name, groups)]
    spec = EnvelopeSpec(hardware, settings, profile or (None if profile_file else model.name), profile_file, policy,
                        params, bounds, draws, hops, routers, SmgSettings(load_interval=smg_load_interval), taught)
    console = Console(stderr=True)
    with progress_for(console) as progress:
        try:
            doc = run_envelope(spec, progress, command_line(click.get_current_context(), PROGRAM))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    assert doc.envelope is not None
    table_console().print(summary_table(doc))
    for check in doc.envelope.checks:
        console.print(check_text(check, not_met="NOT MET"))
    if out_dir is not None:
        write_all(doc, out_dir, envelope_markdown(doc))
        console.print(f"wrote {out_dir}/results.json, results.csv, throughput.png, latency.png, report.md")
    if not doc.envelope.all_met:
        raise SystemExit(1)


def _hops(texts: tuple[str, ...]) -> dict[str, float]:
    """`--hop-ms` values as seconds per target (`MS` alone: every target)."""
    hops: dict[str, float] = {}
    for text in texts:
        target, _, ms = text.rpartition("=")
        value = float(ms)
        if not 0 <= value < float("inf"):
            raise ValueError(f"a hop is a non-negative number of ms, got {text!r}")
        for name in (target,) if target else TARGETS:
            if name not in TARGETS:
                raise ValueError(f"targets are {', '.join(TARGETS)}; got {name!r}")
            hops[name] = value / 1000.0
    return hops


def _members(text: str) -> list[Member]:
    if text == "family":
        return family()
    if text == "grid":
        return members()
    try:
        return [Member.parse(name.strip()) for name in text.split(",") if name.strip()]
    except ValueError as exc:
        raise bad_parameter("--members", exc) from None


def _family_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options `family` and `family-ceiling` share: the members, the workloads, the processes, the seed."""
    options = (
        click.option("--members", "member_text", default="family", show_default=True, metavar="family|grid|NAME,...",
                     help="the default family (29 members), the whole grid (240), or members named like x16-s2-line-k2"),
        click.option("--workloads", "workload_text", default=",".join(WORKLOADS), show_default=True, metavar="LIST",
                     help="workloads to run each member under"),
        click.option("--jobs", type=click.IntRange(min=1), default=None, help="processes [default: one per core]"),
        click.option("--seed", type=int, default=0, show_default=True),
    )
    for option in reversed(options):  # as stacked decorators apply: the last first
        command = option(command)
    return command


@main.command("family")
@_family_options
@click.option("--input-len", type=click.IntRange(min=1), default=Scale.input_len, show_default=True)
@click.option("--output-len", type=click.IntRange(min=2), default=Scale.output_len, show_default=True)
@click.option("--requests-factor", type=click.IntRange(min=1), default=1, show_default=True,
              help="send this many times the requests (steadier statistics, that many times the run time)")
@click.option("--policy-param", "policy_params", multiple=True, metavar="KEY=VALUE",
              help="policy parameter (repeatable), e.g. adaptive_probe_every=400")
@click.option("--taught", is_flag=True,
              help="a what-if: specgate's policy starts knowing every server's curve at the workload's lengths "
                   "(an open loop's steady state), as if it had served every load before")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write every cell's checks here (JSON)")
@click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the report here (Markdown: the command, the table, the failures)")
def family_command(member_text: str, workload_text: str, jobs: int | None, seed: int, input_len: int, output_len: int,
                   requests_factor: int, policy_params: tuple[str, ...], taught: bool, out_file: Path | None,
                   markdown_file: Path | None) -> None:
    """Every member of the profile family under every workload; the worst ratio per bound, and what fails."""
    chosen = _members(member_text)
    names = _workloads(workload_text)
    params = parse_policy_params(policy_params)
    began = time.perf_counter()
    scale = replace(Scale(), input_len=input_len, output_len=output_len).times(requests_factor)
    cells = run_family(chosen, names, scale=scale, seed=seed,
                       jobs=jobs or len(os.sched_getaffinity(0)), policy_params=params, taught=taught)
    seconds = time.perf_counter() - began
    table_console().print(family_table(cells))
    console = Console(stderr=True)
    for line in failures_text(cells):
        console.print(line, highlight=False, markup=False)
    console.print(f"{len(chosen)} members x {len(names)} workloads in {seconds:.1f} s", highlight=False)
    if out_file is not None:
        out_file.write_bytes(cells_json(cells, seconds))
    if markdown_file is not None:
        markdown_file.write_text(family_markdown(cells, seconds, command_line(click.get_current_context(), PROGRAM)))


@main.command("family-ceiling")
@_family_options
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write every cell's levels here (JSON)")
@click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the report here (Markdown)")
def family_ceiling_command(member_text: str, workload_text: str, jobs: int | None, seed: int, out_file: Path | None,
                           markdown_file: Path | None) -> None:
    """Every member under every workload on specgate's own layout with one fixed mode assignment (every group on
    EAGLE, every group plain, half each), each level judged by the workload's bounds: which of specgate's misses
    some assignment per level would meet (the policy's) and which none does (the layout's or the bounds')."""
    chosen = _members(member_text)
    names = _workloads(workload_text)
    began = time.perf_counter()
    cells = run_ceiling(chosen, names, seed=seed, jobs=jobs or len(os.sched_getaffinity(0)))
    seconds = time.perf_counter() - began
    for cell in cells:
        missed = "; ".join(level_text(lv) for lv in cell.levels if not lv.specgate or not lv.met_by)
        click.echo(f"{cell.member} {cell.workload}: {verdict(cell)}" + (f" ({missed})" if missed else ""))
    counts = {k: sum(1 for c in cells if verdict(c) == k) for k in ("met", "met beyond", "policy", "layout")}
    click.echo(", ".join(f"{k} {n}" for k, n in counts.items()) + f" of {len(cells)} cells in {seconds:.1f} s")
    if out_file is not None:
        out_file.write_bytes(ceiling_json(cells, seconds))
    if markdown_file is not None:
        markdown_file.write_text(ceiling_markdown(cells, seconds, command_line(click.get_current_context(), PROGRAM)))


def _workloads(text: str) -> list[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown or not names:
        raise click.BadParameter(f"workloads are {', '.join(WORKLOADS)}; got {text!r}", param_hint="--workloads")
    return names


@main.command("family-compare")
@click.argument("sweeps", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--threshold", type=click.FloatRange(min=0.0), default=THRESHOLD, show_default=True,
              help="a worst-level ratio moved by more than this share counts as better or worse")
@click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the comparison here too (Markdown, with the command)")
def family_compare_command(sweeps: tuple[Path, ...], threshold: float, markdown_file: Path | None) -> None:
    """Family sweeps (`family --out` files) compared in pairs, BEFORE AFTER [BEFORE AFTER ...] (one pair per seed,
    say): each pair's cells meeting every bound and the verdicts that changed, then every worst-level ratio's
    change pooled over the pairs: how many moved either way, their geometric mean per workload and bound, the
    largest moves."""
    if len(sweeps) % 2:
        raise click.BadParameter(f"sweeps come in pairs, BEFORE AFTER; got {len(sweeps)} files", param_hint="SWEEPS")
    pairs = [(load_cells(sweeps[i]), load_cells(sweeps[i + 1])) for i in range(0, len(sweeps), 2)]
    names = [(sweeps[i].name, sweeps[i + 1].name) for i in range(0, len(sweeps), 2)]
    lines = comparison_lines(compare(pairs, threshold), names)
    click.echo("\n".join(lines))
    if markdown_file is not None:
        command = command_line(click.get_current_context(), PROGRAM)
        markdown_file.write_text(f"# Family sweeps compared\n\nCommand: `{command}`\n\n" + "\n".join(lines) + "\n")
