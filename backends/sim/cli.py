"""`specgate sim` (also `python -m backends.sim`): run a simulated SGLang server."""

from __future__ import annotations

import asyncio
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import orjson
import uvloop
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from backends.fdlimit import raise_nofile_limit
from backends.resolve import COLOCATED_MEM_SHARE
from backends.sim.faults import FAULT_KINDS, describe_error, parse_fault
from backends.sim.layout import LayoutError, plan_layout
from backends.sim.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE, ROLES, ProfileError, load_profile
from backends.sim.server import SimProcess
from backends.sim.settings import SimSettings

_SECRET_FLAGS = ("--api-key", "--admin-api-key")
# Crashing or clearing only make sense once the server runs (POST /_test/fault).
STARTUP_FAULT_KINDS = tuple(kind for kind in FAULT_KINDS if kind not in ("crash", "clear"))


def redacted_command(argv: list[str]) -> str:
    """The command line with API keys replaced, for `/server_info`'s `launch_command`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
        elif arg in _SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif arg.startswith(tuple(f"{flag}=" for flag in _SECRET_FLAGS)):
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return shlex.join(out)


def _labels(value: str | None) -> dict[str, str]:
    if not value:
        return {}
    try:
        labels = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--extra-metric-labels") from exc
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise click.BadParameter(
            'a JSON object of string values, e.g. \'{"pool":"spec"}\'', param_hint="--extra-metric-labels"
        )
    return labels


def _option_error(err: ErrorDetails) -> str:
    message = str(err["msg"]).removeprefix("Value error, ")
    field = str(err["loc"][0]) if err["loc"] else ""
    return f"--{field.replace('_', '-')}: {message}" if field else message


@click.command("sim", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--role", type=click.Choice(ROLES), help="server to simulate (not with --colocated)")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    multiple=True,
    help="port to serve on; 0 picks a free one. Repeat for replicas, each on its own simulated GPUs",
)
@click.option(
    "--colocated", is_flag=True, help="serve eagle and plain from one process, each pair on ONE simulated GPU timeline"
)
@click.option(
    "--eagle-port", type=click.IntRange(0, 65535), multiple=True, help="eagle port with --colocated; one per group"
)
@click.option(
    "--plain-port", type=click.IntRange(0, 65535), multiple=True, help="plain port with --colocated; one per group"
)
@click.option(
    "--eagle-only-port",
    type=click.IntRange(0, 65535),
    multiple=True,
    help="with --colocated: an EAGLE server alone on a group of its own (an EAGLE-only group); one per group",
)
@click.option(
    "--plain-only-port",
    type=click.IntRange(0, 65535),
    multiple=True,
    help="with --colocated: a plain server alone on a group of its own (a plain-only group); one per group",
)
@click.option(
    "--eagle-mem-fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="eagle's share of its group's GPU memory with --colocated [default: its weights plus half the KV room "
    f"the two copies leave of {sum(COLOCATED_MEM_SHARE.values()):g}]",
)
@click.option(
    "--plain-mem-fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="plain's share of its group's GPU memory with --colocated [default: its weights plus the other half]",
)
@click.option(
    "--gpus-per-group",
    type=click.IntRange(min=1),
    help="GPUs of each group or replica: scales its memory, not its step times [default: the profile's num_gpus]",
)
@click.option(
    "--profile",
    type=click.Choice(sorted(BUILTIN_PROFILES)),
    default=DEFAULT_PROFILE,
    help="built-in calibration profile",
)
@click.option(
    "--profile-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML or JSON file whose keys override the --profile",
)
@click.option("--host", default="127.0.0.1")
@click.option("--time-scale", type=float, default=1.0, help="multiplies every modelled duration (0.1 = 10x faster)")
@click.option("--seed", type=int, default=0, help="seeds acceptance draws and the generated text")
@click.option("--served-model-name", help="model id to serve [default: the profile's model_path]")
@click.option("--api-key", help="require this Bearer key (not for /health*, /ready, /metrics)")
@click.option("--admin-api-key", help="key for /abort_request and the test-only routes")
@click.option(
    "--startup-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    help="seconds of 503 on /ready and /health after binding",
)
@click.option("--enable-metrics", is_flag=True, help="serve /metrics (404 without, as SGLang)")
@click.option("--extra-metric-labels", help='JSON object of labels added to every metric, e.g. \'{"pool":"spec"}\'')
@click.option("--max-running-requests", type=click.IntRange(min=1), help="override the profile's running-request cap")
@click.option("--eagle-max-running-requests", type=click.IntRange(min=1), help="the eagle cap with --colocated")
@click.option("--plain-max-running-requests", type=click.IntRange(min=1), help="the plain cap with --colocated")
@click.option(
    "--enable-response-store", is_flag=True, help="store Responses API responses for retrieval and follow-ups (as SGLang)"
)
@click.option("--disable-radix-cache", is_flag=True, help="turn the prefix (radix) cache off, as SGLang's flag")
@click.option(
    "--enable-cache-report",
    is_flag=True,
    help="report usage.prompt_tokens_details.cached_tokens on chat and completions (as SGLang)",
)
@click.option(
    "--enable-test-endpoints", is_flag=True, help="serve the test-only /_test/requests and /_test/fault routes"
)
@click.option(
    "--test-fault",
    "test_faults",
    multiple=True,
    help=f"fault active from the start: a kind ({', '.join(STARTUP_FAULT_KINDS)}) or its JSON spec",
)
@click.option(
    "--drain-timeout", type=click.FloatRange(min=0), default=30.0, help="seconds SIGTERM waits for running requests"
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error", "critical"]), default="info")
def sim_command(**options: Any) -> None:
    """Run a simulated SGLang server (EAGLE-3, plain or adaptive) with a calibrated timing model."""
    settings = _settings(options)
    try:
        profile = load_profile(settings.profile, settings.profile_file)
    except ProfileError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        slots = plan_layout(settings, profile)
    except LayoutError as exc:
        raise click.ClickException(f"cannot start: {exc}") from exc
    logging.basicConfig(
        level=settings.log_level.upper(), format="[%(asctime)s] %(message)s", stream=sys.stdout, force=True
    )
    raise_nofile_limit()  # as SGLang does: its sockets are bounded by the hard limit, not the soft default
    command = redacted_command([sys.executable, "-m", "backends.sim", *sys.argv[1:]])
    process = SimProcess(settings, profile, slots, command)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(process.run())
    except OSError as exc:
        raise click.ClickException(f"cannot serve: {exc}") from exc


def _settings(options: dict[str, Any]) -> SimSettings:
    """The settings the command's parsed options give (click errors naming the option at fault)."""
    try:
        options["test_faults"] = [parse_fault(text) for text in options["test_faults"]]
    except (ValidationError, orjson.JSONDecodeError) as exc:
        raise click.BadParameter(describe_error(exc), param_hint="--test-fault") from exc
    if any(fault.kind not in STARTUP_FAULT_KINDS for fault in options["test_faults"]):
        raise click.BadParameter(
            f"at start a fault is one of {', '.join(STARTUP_FAULT_KINDS)}", param_hint="--test-fault"
        )
    options["extra_metric_labels"] = _labels(options["extra_metric_labels"])
    for flag in ("port", "eagle_port", "plain_port", "eagle_only_port", "plain_only_port"):
        options[flag] = list(options[flag])
    try:
        return SimSettings(**options)
    except ValidationError as exc:
        raise click.UsageError("; ".join(_option_error(err) for err in exc.errors())) from exc


def read_settings(args: Sequence[str]) -> SimSettings:
    """The settings a simulator process started with `args` (its argv after `-m backends.sim`) runs with."""
    with sim_command.make_context("sim", list(args)) as ctx:
        return _settings(dict(ctx.params))
