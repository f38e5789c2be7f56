"""`python -m loadtest envelope`: start the simulated stack, sweep it, check the envelope bounds."""

from __future__ import annotations

import asyncio
import shutil
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import click
import uvloop
from click.core import ParameterSource
from rich.console import Console

from gateway.config import PolicyConfig
from loadtest.envelope.baselines import ROUTER_CHOICES, Router, default_router_choice
from loadtest.envelope.comparison import FAILED, Bound, check_text, envelope_markdown
from loadtest.envelope.document import envelope_document
from loadtest.envelope.fair import FairEnvelope, Hardware
from loadtest.envelope.harness import Envelope, StackSettings, Topology
from loadtest.envelope.planned import PlannedLayout
from loadtest.envelope.smg import Smg
from backends.sim.profiles import Profile
from loadtest.envelope.timescale import LevelLoad, auto_time_scale, profile_for
from loadtest.options import bad_parameter
from loadtest.progress import progress_for
from loadtest.report import command_line, write_all
from loadtest.sweep import SweepSettings
from loadtest.table import summary_table, table_console
from loadtest.workload_options import RATE_HELP, REQUESTS_HELP, WorkloadChoice, workload_options

DEFAULT_LEVELS = "1,2,4,8,16,32,64"
DEFAULT_MIN_THROUGHPUT_RATIO = 0.97
DEFAULT_MAX_TPOT_RATIO = 1.03


def parse_param(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE read as int, float, true/false, or text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"policy parameter must be KEY=VALUE, got {text!r}")
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for kind in (int, float):
            try:
                value = kind(raw)
                break
            except ValueError:
                continue
    return key, value


def parse_policy_params(texts: tuple[str, ...]) -> dict[str, Any]:
    """`--policy-param` values as a dict, or a usage error naming the option."""
    try:
        return dict(parse_param(p) for p in texts)
    except ValueError as exc:
        raise bad_parameter("--policy-param", exc) from None


def chosen_profile(profile: str | None, profile_file: Path | None) -> Profile:
    """`--profile`/`--profile-file` as the simulator reads them, or a usage error naming the option."""
    try:
        return profile_for(profile, profile_file)
    except ValueError as exc:
        raise bad_parameter("--profile-file" if profile_file else "--profile", exc) from None


def sweep_settings(workload: WorkloadChoice, concurrency: str | None, request_rate: str | None,
                   requests_per_level: str | None, min_requests: int, input_len: int, output_len: int, warmup: int,
                   seed: int) -> SweepSettings:
    """The sweep the load tool's workload options describe (levels default to `DEFAULT_LEVELS`)."""
    levels = workload.levels(concurrency, request_rate, DEFAULT_LEVELS)
    return SweepSettings(levels=levels, requests_per_level=workload.requests(requests_per_level, min_requests, levels),
                         input_len=input_len, output_len=output_len, warmup=warmup, seed=seed, **workload.settings())


def parse_time_scale(text: str) -> float | None:
    """A positive number, or None for `auto`."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"time scale must be a positive number or 'auto', got {text!r}") from None
    if value <= 0:
        raise ValueError(f"time scale must be positive, got {value}")
    return value


class Interrupted(Exception):
    """The run was stopped by a signal (after the stack it started was stopped)."""

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(f"interrupted by {sig.name}; stopped everything it had started")
        self.exit_code = 128 + int(sig)


async def _run_until_signal(envelope: Envelope | FairEnvelope, command: str) -> tuple[Any, Any]:
    # SIGINT and SIGTERM cancel the run; `Envelope.run` stops the stack in its `finally`. Handling
    # SIGINT here too covers shells that start background jobs with SIGINT ignored.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        received.append(sig)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await envelope.run(command)
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0]) from None
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@click.command()
@click.option("--profile", default=None, help="built-in simulator profile: field-8gpu or llama8b-h100")
@click.option("--profile-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="simulator profile file (TOML or JSON)")
@click.option("--compare", type=click.Choice(["same-hardware", "single"]), default="same-hardware", show_default=True,
              help="same-hardware: specgate on K groups against plain-dp, eagle-dp and adaptive-dp on the same GPUs; "
                   "single: specgate against the two servers it routes to (the old comparison)")
@click.option("--groups", type=click.IntRange(min=1), default=None,
              help="same-hardware: K, the GPU groups (specgate) and data-parallel replicas (baselines) [default: 1]")
@click.option("--gpus-per-group", type=click.IntRange(min=1), default=None,
              help="same-hardware: G, the GPUs of each group or replica [default: the profile's num_gpus]")
@click.option("--eagle-mem-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="same-hardware: specgate's EAGLE server's share of its group's GPU memory [default: the launcher's]")
@click.option("--plain-mem-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="same-hardware: specgate's plain server's share of its group's GPU memory [default: the launcher's]")
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="same-hardware: run the layout `specgate plan --json` wrote to this file (its groups, GPUs per group, "
                   "memory shares and plain-only groups) instead of --groups/--gpus-per-group/--*-mem-fraction")
@click.option("--baseline-router", type=click.Choice(list(ROUTER_CHOICES)), default=None,
              help="same-hardware, K > 1: what routes each baseline's K servers: least-inflight (the balancer), "
                   "smg-cache-aware (the real SMG router, --policy cache_aware: targets plain-dp+smg, ...) or both "
                   "[default: both for --dataset shared-prefix, multi-turn and trace, else least-inflight]")
@click.option("--smg", "smg_path", type=click.Path(exists=True, dir_okay=False), envvar="SPECGATE_SMG", default=None,
              help="the SMG router's `smg` executable (PyPI smg) [default: $SPECGATE_SMG, else `smg` on PATH]")
@click.option("--topology", type=click.Choice(["partitioned", "colocated", "groups"]), default=None,
              help="single: the servers' layout [default: partitioned]; same-hardware: colocated for K=1, groups above "
                   "(the default)")
@click.option("--policy", default=PolicyConfig().name, show_default=True, help="gateway routing policy")
@click.option("--policy-param", "policy_params", multiple=True, metavar="KEY=VALUE",
              help="policy parameter (repeatable), e.g. threshold=2 or eagle_max_inflight=48")
@click.option("--eagle-max-running-requests", type=click.IntRange(min=1), default=None,
              help="the EAGLE server's running-request cap [default: the profile's]; set it above the policy's "
                   "EAGLE cap so 'eagle direct' runs every request it is sent, as a real deployment's would")
@click.option("--concurrency", default=None, metavar="LIST", help=f"closed-loop levels [default: {DEFAULT_LEVELS}]")
@click.option("--request-rate", default=None, metavar="LIST",
              help=RATE_HELP + "; rates are the model's (the time scale stretches the arrivals too)")
@click.option("--time-scale", "time_scale_text", default="auto", show_default=True, metavar="X|auto",
              help="simulator time scale (>1 is slower); auto fits the chunk rate to this machine")
@click.option("--requests-per-level", default=None, metavar="N|Nx", help=REQUESTS_HELP)
@click.option("--min-requests-per-level", "min_requests", type=click.IntRange(min=0), default=16, show_default=True,
              help="never fewer requests than this at a level (steadier medians at low concurrency)")
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--min-throughput-ratio", type=click.FloatRange(min=0.0), default=None,
              help=f"fail unless specgate tok/s >= R x the best baseline at every level [default: "
                   f"{DEFAULT_MIN_THROUGHPUT_RATIO} same-hardware, none single]")
@click.option("--max-tpot-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate TPOT p50 <= R x the best baseline (same-hardware: the best that carries the "
                   f"load) at every level [default: {DEFAULT_MAX_TPOT_RATIO} same-hardware, none single]")
@click.option("--max-ttft-p50-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate TTFT p50 <= R x the lowest carrying baseline's at every level")
@click.option("--max-e2e-p50-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate E2E p50 <= R x the lowest carrying baseline's at every level")
@click.option("--max-e2e-p99-ratio", type=click.FloatRange(min=0.0), default=None,
              help="fail unless specgate E2E p99 <= R x the lowest carrying baseline's at every level")
@click.option("--no-failed", is_flag=True, default=False,
              help="fail a level where any target failed a request (failures are reported either way)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@workload_options
def envelope(
    profile: str | None,
    profile_file: Path | None,
    compare: str,
    groups: int | None,
    gpus_per_group: int | None,
    eagle_mem_fraction: float | None,
    plain_mem_fraction: float | None,
    plan_path: Path | None,
    baseline_router: str | None,
    smg_path: str | None,
    topology: str | None,
    policy: str,
    policy_params: tuple[str, ...],
    eagle_max_running_requests: int | None,
    concurrency: str | None,
    request_rate: str | None,
    time_scale_text: str,
    requests_per_level: str | None,
    min_requests: int,
    input_len: int,
    output_len: int,
    warmup: int,
    seed: int,
    min_throughput_ratio: float | None,
    max_tpot_ratio: float | None,
    max_ttft_p50_ratio: float | None,
    max_e2e_p50_ratio: float | None,
    max_e2e_p99_ratio: float | None,
    no_failed: bool,
    out_dir: Path,
    workload: WorkloadChoice,
) -> None:
    """Compare specgate with the same GPUs run each other way (or, with --compare single, its two servers)."""
    if (profile is None) == (profile_file is None):
        raise click.UsageError("give exactly one of --profile NAME or --profile-file PATH")
    params = parse_policy_params(policy_params)
    settings = sweep_settings(workload, concurrency, request_rate, requests_per_level, min_requests, input_len,
                              output_len, warmup, seed)
    try:
        fixed_scale = parse_time_scale(time_scale_text)
    except ValueError as exc:
        raise bad_parameter("--time-scale", exc) from None
    model = chosen_profile(profile, profile_file)
    same_hardware = compare == "same-hardware"
    if plan_path is None:
        # None (not 1) by default, so the recorded command of a --plan run does not spell out a --groups it replaces.
        hardware = Hardware(groups or 1, gpus_per_group or model.num_gpus, eagle_mem_fraction, plain_mem_fraction)
    else:
        hardware = planned_hardware(click.get_current_context(), plan_path, same_hardware)
    layout = _layout(same_hardware, hardware, topology, model.node_gpus)
    routers, smg = _routers(same_hardware, baseline_router, workload.dataset.name, hardware.groups, smg_path)
    if fixed_scale is None:
        replicas = hardware.groups if same_hardware else 1
        scale, note = auto_time_scale(model, [LevelLoad.of(plan) for plan in settings.plans()], replicas=replicas)
    else:
        scale, note = fixed_scale, "set with --time-scale"

    stack = StackSettings(profile=profile, profile_file=profile_file, topology=layout,
                          policy=policy, policy_params=params, time_scale=scale, seed=seed,
                          eagle_max_running_requests=eagle_max_running_requests)
    settings = replace(settings, time_scale=scale, timeout=max(600.0, 600.0 * scale))
    if same_hardware:  # the bar; the single comparison checks only what it is asked to
        min_throughput_ratio = DEFAULT_MIN_THROUGHPUT_RATIO if min_throughput_ratio is None else min_throughput_ratio
        max_tpot_ratio = DEFAULT_MAX_TPOT_RATIO if max_tpot_ratio is None else max_tpot_ratio
    limits: tuple[tuple[str, Literal[">=", "<="], float | None], ...] = (
        ("throughput_ratio", ">=", min_throughput_ratio), ("tpot_ratio", "<=", max_tpot_ratio),
        ("ttft_p50_ratio", "<=", max_ttft_p50_ratio), ("e2e_p50_ratio", "<=", max_e2e_p50_ratio),
        ("e2e_p99_ratio", "<=", max_e2e_p99_ratio), (FAILED, "<=", 0.0 if no_failed else None),
    )
    bounds = [Bound(name, op, value) for name, op, value in limits if value is not None]

    console = Console(stderr=True)
    console.print(f"time scale {scale:g} ({note}); logs in {out_dir / 'logs'}", highlight=False)
    command = command_line(click.get_current_context())
    with progress_for(console) as progress:
        try:
            runner: Envelope | FairEnvelope = (
                FairEnvelope(stack, hardware, settings, out_dir, progress, routers, smg) if same_hardware
                else Envelope(stack, settings, out_dir, progress)
            )
            results, stack_info = uvloop.run(_run_until_signal(runner, command))
        except Interrupted as exc:
            console.print(str(exc))
            raise SystemExit(exc.exit_code) from None
        except (RuntimeError, TimeoutError) as exc:
            raise click.ClickException(str(exc)) from None
    doc = envelope_document(results, runner, stack_info, command, bounds, note)
    assert doc.envelope is not None
    write_all(doc, out_dir, envelope_markdown(doc))
    table_console().print(summary_table(doc))
    for check in doc.envelope.checks:
        console.print(check_text(check, not_met="NOT MET"))
    if not doc.health.ok:
        console.print(
            f"[bold red]SELF-CHECK FAILED at {len(doc.health.flagged)} level(s): these numbers may measure this machine, "
            "not the servers (see report.md):[/]"
        )
        for flag in doc.health.flagged:
            console.print(f"  {flag}", style="red", markup=False, highlight=False)
    console.print(f"wrote {out_dir}/results.json, results.csv, throughput.png, latency.png, report.md")
    if not doc.envelope.all_met:
        raise SystemExit(1)


def planned_hardware(ctx: click.Context, path: Path, same_hardware: bool) -> Hardware:
    """The hardware of a `specgate plan --json` layout; a usage error beside the options it replaces."""
    if not same_hardware:
        raise click.UsageError("--plan lays out the same-hardware comparison (drop --compare single)")
    replaced = ("groups", "gpus_per_group", "eagle_mem_fraction", "plain_mem_fraction")
    given = [name for name in replaced if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"--plan sets the layout: drop --{given[0].replace('_', '-')}")
    try:
        return PlannedLayout.read(path).hardware()
    except ValueError as exc:
        raise bad_parameter("--plan", exc) from None


def _layout(same_hardware: bool, hardware: Hardware, topology: str | None, node_gpus: int) -> Topology:
    """The stack's topology for the chosen comparison; a contradictory flag is a usage error."""
    if not same_hardware:
        if topology == "groups":
            raise click.UsageError("--topology groups needs the same-hardware comparison (drop --compare single)")
        if hardware.groups != 1 or hardware.eagle_mem_fraction or hardware.plain_mem_fraction:
            raise click.UsageError(
                "--groups and --eagle/--plain-mem-fraction apply to the same-hardware comparison (drop --compare single)"
            )
        return "colocated" if topology == "colocated" else "partitioned"
    wanted: Topology = "colocated" if hardware.groups == 1 else "groups"
    if topology is not None and topology != wanted:
        raise click.UsageError(
            f"--topology {topology}: the same-hardware comparison runs specgate as {wanted!r} with --groups "
            f"{hardware.groups}; use --compare single for the partitioned stack"
        )
    if hardware.groups * hardware.gpus_per_group > node_gpus:
        raise click.UsageError(
            f"--groups {hardware.groups} x --gpus-per-group {hardware.gpus_per_group} needs "
            f"{hardware.groups * hardware.gpus_per_group} GPUs; the profile's node has {node_gpus}"
        )
    return wanted


def _routers(
    same_hardware: bool, choice: str | None, dataset: str, groups: int, smg_path: str | None
) -> tuple[tuple[Router, ...], Smg | None]:
    """The routers in front of the baselines, and SMG where one is SMG (checked to run before anything starts)."""
    if not same_hardware:
        if choice is not None:
            raise click.UsageError("--baseline-router applies to the same-hardware comparison (drop --compare single)")
        return (), None
    if choice is not None and choice != "least-inflight" and groups == 1:
        raise click.UsageError(f"--baseline-router {choice}: with --groups 1 each baseline is one server, called "
                               "directly; a router needs K > 1 replicas to choose between")
    picked = choice or default_router_choice(dataset, groups)
    routers = ROUTER_CHOICES[picked]
    if "smg" not in routers:
        return routers, None
    path = smg_path or shutil.which("smg")
    if path is None:
        why = f"--baseline-router {picked}" + ("" if choice else f" (the default for --dataset {dataset})")
        raise click.UsageError(
            f"{why} runs the SMG router: install it (pip install smg==1.13.0, in a venv of its own) and give "
            "--smg PATH or SPECGATE_SMG, or choose --baseline-router least-inflight"
        )
    try:
        return routers, Smg.probe(path)
    except RuntimeError as exc:
        raise click.BadParameter(str(exc), param_hint="--smg") from None
