"""`specgate plan` for traffic: the options (the load tool's workload options, the node, the profile) and the run.

`specgate` (the composition root) registers the command; this module holds what it needs from
vnode: `planner_options` adds the options to a click command, `run_planner` plans and prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import tomli_w
from rich.console import Console
from rich.table import Table

from gateway.config import PolicyConfig, Settings
from loadtest.envelope.cli import DEFAULT_LEVELS, chosen_profile, parse_policy_params, sweep_settings
from loadtest.envelope.fair import specgate_config
from loadtest.envelope.harness import StackSettings
from loadtest.table import table_console
from loadtest.workload_options import RATE_HELP, REQUESTS_HELP, WorkloadChoice, workload_options
from vnode.planner import DEFAULT_KV_SHARES, Outcome, PlanResult, PlanSpec, Unplannable, plan

PLANNER_REQUESTS = "2x"  # per concurrency slot: long contexts make each sweep costly, and ranks settle by then
SERVE_PORT = 8000

_OPTIONS = (
    click.option("--profile", default=None, help="built-in simulator profile (field-8gpu, llama8b-h100, h200-llama8b)"),
    click.option("--profile-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="simulator profile file (TOML or JSON; a calibrated one), laid over --profile"),
    click.option("--gpus", type=click.IntRange(min=1), default=None,
                 help="the node's GPUs to lay out [default: the profile's node_gpus]"),
    click.option("--eagle-kv-shares", "kv_share_text", default=",".join(f"{s:g}" for s in DEFAULT_KV_SHARES),
                 show_default=True, metavar="LIST",
                 help="memory splits to try: EAGLE's share of the KV room a co-located group's two copies leave "
                      "(0.5 is the launcher's default, listed first so it wins ties)"),
    click.option("--longest-request-tokens", type=click.IntRange(min=1), default=None,
                 help="prompt + output tokens of the longest request the node must serve: every split keeps a "
                      "co-located plain server's KV room for one [default: the profile's context length]"),
    click.option("--policy", default=PolicyConfig().name, show_default=True, help="gateway routing policy"),
    click.option("--policy-param", "policy_params", multiple=True, metavar="KEY=VALUE", help="policy parameter (repeatable)"),
    click.option("--concurrency", default=None, metavar="LIST", help=f"closed-loop levels [default: {DEFAULT_LEVELS}]"),
    click.option("--request-rate", default=None, metavar="LIST", help=RATE_HELP),
    click.option("--requests-per-level", default=None, metavar="N|Nx",
                 help=REQUESTS_HELP.replace("4x closed loop", f"{PLANNER_REQUESTS} closed loop")),
    click.option("--min-requests-per-level", "min_requests", type=click.IntRange(min=0), default=16, show_default=True,
                 help="never fewer requests than this at a level"),
    click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True),
    click.option("--output-len", type=click.IntRange(min=2), default=128, show_default=True),
    click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--jobs", type=click.IntRange(min=1), default=None, help="processes [default: one per core]"),
    click.option("--write-config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="write a `specgate serve` config (TOML) for the best layout here"),
    click.option("--show", type=click.IntRange(min=1), default=3, show_default=True,
                 help="per-level predictions for this many of the best layouts"),
)


def planner_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the planner's options and the load tool's workload options (as `workload`) to a click command."""
    command = workload_options(command)
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def run_planner(
    profile: str | None,
    profile_file: Path | None,
    gpus: int | None,
    kv_share_text: str,
    longest_request_tokens: int | None,
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
    jobs: int | None,
    write_config: Path | None,
    show: int,
    workload: WorkloadChoice,
    as_json: bool,
) -> None:
    """Plan the node for the traffic: the ranked table (stdout), or with `as_json` the best layout as one object."""
    if profile is None and profile_file is None:
        raise click.UsageError("give --config FILE (the launch plan of a config), or --profile/--profile-file and the "
                               "traffic (plan the node's layout)")
    model = chosen_profile(profile, profile_file)
    params = tuple(parse_policy_params(policy_params).items())
    closed = workload.levels(concurrency, request_rate, DEFAULT_LEVELS)[0].concurrency
    settings = sweep_settings(workload, concurrency, request_rate,
                              requests_per_level or (PLANNER_REQUESTS if closed else None), min_requests, input_len,
                              output_len, warmup, seed)
    spec = PlanSpec(profile, profile_file, gpus or model.node_gpus, settings, policy, params, _kv_shares(kv_share_text),
                    longest_request_tokens=longest_request_tokens)
    console = Console(stderr=True)
    # The sweeps are counted once the layouts are checked: the bar learns its length from the first report.
    with click.progressbar(length=1, label="sweeps", file=sys.stderr) as bar:
        def advance(done: int, total: int) -> None:
            bar.length = total
            bar.update(done - bar.pos)
        try:
            result = plan(spec, jobs or len(os.sched_getaffinity(0)), advance)
        except Unplannable as exc:
            raise click.UsageError(str(exc)) from None
    best = result.best
    if as_json:
        click.echo(best.candidate.layout(best.predicted).model_dump_json(indent=2))
    else:
        out = table_console()
        out.print(ranked_table(result))
        for outcome in result.ranked[:show]:
            out.print(levels_table(outcome))
    console.print(f"{len(result.ranked) + len(result.refused)} candidate layouts ({len(result.refused)} refused), "
                  f"{result.sweeps} sweeps in {result.seconds:.1f} s; best: {best.candidate.describe()}", highlight=False)
    if write_config is not None:
        write_config.write_text(tomli_w.dumps(serve_config(spec, best)))
        console.print(f"wrote {write_config} (`specgate serve --config {write_config}`)", highlight=False)


def _kv_shares(text: str) -> tuple[float, ...]:
    try:
        shares = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"a list of numbers, got {text!r}", param_hint="--eagle-kv-shares") from None
    if not shares or any(not 0.0 < s < 1.0 for s in shares):
        raise click.BadParameter(f"shares lie strictly between 0 and 1, got {text!r}", param_hint="--eagle-kv-shares")
    return shares


def serve_config(spec: PlanSpec, best: Outcome) -> dict[str, Any]:
    """The `specgate serve` config of the best layout (simulated servers of the planned profile), validated."""
    hardware = best.candidate.hardware
    stack = StackSettings(spec.profile, spec.profile_file, "colocated" if hardware.groups == 1 else "groups",
                          spec.policy, dict(spec.policy_params), seed=spec.settings.seed)
    config = specgate_config(stack, hardware, SERVE_PORT)
    config["server"]["log_level"] = "info"  # the envelope quiets its gateway; a served node logs as usual
    if spec.longest_request_tokens is not None:
        config["launch"]["longest_request_tokens"] = spec.longest_request_tokens
    Settings.model_validate(config)  # what `specgate serve` would refuse, refused here
    return config


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def ranked_table(result: PlanResult) -> Table:
    """One row per candidate, best first: worst ratios, each server's memory, why it ranks where it does (or was refused)."""
    table = Table(title="Layouts, best first (ratios: against the best one-mode baseline of any grouping, per level)")
    for header in ("#", "layout", "memory per server", "worst throughput ratio", "worst TPOT p50 ratio",
                   "worst E2E p99 ratio", "why"):
        table.add_column(header)
    first = result.best
    for rank, outcome in enumerate(result.ranked, start=1):
        table.add_row(str(rank), outcome.candidate.describe(), "\n".join(str(m) for m in outcome.memory),
                      str(outcome.worst("throughput_ratio", True)), str(outcome.worst("tpot_ratio", False)),
                      str(outcome.worst("e2e_p99_ratio", False)), _why(rank, outcome, first))
    for outcome in result.refused:
        table.add_row("-", outcome.candidate.describe(), "\n".join(str(m) for m in outcome.memory), "", "", "",
                      f"refused: {outcome.refused}")
    return table


def _why(rank: int, outcome: Outcome, first: Outcome) -> str:
    if rank == 1:
        return "best worst-level throughput, then TPOT, then E2E p99 (ties within 1% keep the default split first)"
    keys, best_keys = outcome.rank_key(), first.rank_key()
    names = ("throughput", "TPOT p50", "E2E p99")
    for name, mine, theirs in zip(names, keys, best_keys, strict=True):
        if mine != theirs:
            return f"behind #1 on {name}" + (" (the ratios before it tie within 1%)" if name != names[0] else "")
    return "ties #1 within 1% on every ratio; listed after it"


def levels_table(outcome: Outcome) -> Table:
    """A layout's predictions per level (model time): throughput, TTFT/TPOT/E2E p50 and p99, and its ratios."""
    table = Table(title=f"{outcome.candidate.describe()}: predicted per level")
    for header in ("level", "out tok/s", "throughput ratio", "best baseline", "TTFT p50", "TTFT p99", "TPOT p50",
                   "TPOT p99", "E2E p50", "E2E p99", "TPOT ratio", "E2E p99 ratio"):
        table.add_column(header)
    for p in outcome.predicted:
        table.add_row(p.level, f"{p.output_tok_s:.1f}", _ratio(p.throughput_ratio), p.best_baseline or "-",
                      *(_ms(v) for v in (p.ttft_p50_ms, p.ttft_p99_ms, p.tpot_p50_ms, p.tpot_p99_ms, p.e2e_p50_ms,
                                         p.e2e_p99_ms)),
                      _ratio(p.tpot_ratio), _ratio(p.e2e_p99_ratio))
    return table


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
