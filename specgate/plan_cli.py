"""`specgate plan`: print the processes `specgate serve` would start for a config, and its warnings; or,
without a config, plan the node's layout for the traffic (`vnode.plan_cli`).

Nothing starts. The text output is meant to be pasted into a shell on the GPU node (API keys are
shown as ***); `--json` is the same plan for scripts.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click
import orjson
from click.core import ParameterSource

from backends.plan import LaunchPlan, ProcessSpec, build_plan, redact_argv, redact_env
from gateway.config import Settings, load_settings
from vnode.plan_cli import planner_options, run_planner


@click.command("plan")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="gateway config (TOML) whose [launch] table to plan (without it: plan the node's layout for the traffic)",
)
@click.option("--json", "as_json", is_flag=True, help="print the plan (with --config) or the best layout as JSON")
@click.option("--strict", is_flag=True, help="--config: exit with status 1 when the plan has warnings")
@planner_options
def plan_command(config_path: Path | None, as_json: bool, strict: bool, **planner: Any) -> None:
    """Show the processes a config starts (--config), or pick the node's layout for the traffic (--profile ...).

    With --config: the exact argv and environment of each backend process, and the warnings found.
    Without: candidate layouts (groups x GPUs, memory split, plain-only groups) run in virtual time
    under the routing policy against the same GPUs run in one mode, ranked.
    """
    if config_path is None:
        if strict:
            raise click.UsageError("--strict checks a config's launch plan: give it with --config")
        run_planner(**planner, as_json=as_json)
        return
    ctx = click.get_current_context()
    own = ("config_path", "as_json", "strict")
    given = [p.name for p in ctx.command.params
             if p.name and p.name not in own and ctx.get_parameter_source(p.name) is not ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(
            f"--{given[0].replace('_', '-')} plans a node for traffic; --config shows a config's launch plan: give one"
        )
    try:
        settings = load_settings(config_path)
        eagle_cap = settings.resolved_policy.eagle_cap
        plan = build_plan(settings.planned_launch, eagle_cap=eagle_cap)
    except (FileNotFoundError, ValueError) as exc:  # ValidationError, PlanError, TOMLDecodeError
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(orjson.dumps(plan_document(settings, plan, eagle_cap), option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(plan_text(settings, plan, eagle_cap))
    if strict and plan.warnings:
        raise SystemExit(1)


def plan_document(settings: Settings, plan: LaunchPlan, eagle_cap: int) -> dict[str, Any]:
    """The plan as plain data (the `--json` output), secrets redacted."""
    launch = settings.launch
    return {
        "launches_backends": settings.launches_backends,
        "engine": launch.engine,
        "topology": launch.topology,
        "policy": settings.policy.name,
        "eagle_cap": eagle_cap,
        "sequential": plan.sequential,
        "processes": [
            {
                "name": p.name,
                "argv": list(redact_argv(p.argv)),
                "command": shell_command(p),
                "env": redact_env(p.env),
                "start_after": p.start_after,
                "endpoints": [
                    {
                        "backend": e.backend,
                        "url": e.url,
                        "speculative": e.speculative,
                        "served_model_name": e.served_model_name,
                        "group": e.group,
                    }
                    for e in p.endpoints
                ],
            }
            for p in plan.processes
        ],
        "unset_ports": _unset_ports(settings),
        "warnings": list(plan.warnings),
    }


def plan_text(settings: Settings, plan: LaunchPlan, eagle_cap: int) -> str:
    """The human-readable plan."""
    launch = settings.launch
    lines: list[str] = []
    if not settings.launches_backends:
        lines += [
            "note: this config lists [[backends]] URLs, so `specgate serve` starts nothing;",
            "      this is what its [launch] table would start without them.",
            "",
        ]
    lines.append(
        f"engine {launch.engine}, topology {launch.topology}, policy {settings.policy.name} "
        f"(EAGLE cap {eagle_cap}), {len(plan.processes)} process(es)"
    )
    if plan.sequential:
        lines.append(
            "start order: in parallel, except that each co-located group starts its plain server "
            "once its EAGLE server is ready"
        )
    for key in _unset_ports(settings):
        lines.append(f"note: {key} is unset, so a free port is picked at each start (this run: below)")
    for process in plan.processes:
        lines += ["", f"[{process.name}]"]
        if process.start_after is not None:
            lines.append(f"  starts once {process.start_after} is ready")
        for e in process.endpoints:
            kind = "speculative" if e.speculative else "plain"
            model = f", model {e.served_model_name}" if e.served_model_name else ""
            lines.append(f"  serves {e.backend} at {e.url} (group {e.group}, {kind}{model})")
        for key, value in redact_env(process.env).items():
            lines.append(f"  env {key}={shlex.quote(value)}")
        lines.append("  " + shell_command(process, multiline=True).replace("\n", "\n  "))
    lines.append("")
    if plan.warnings:
        lines.append(f"{len(plan.warnings)} warning(s):")
        lines += [f"  - {w}" for w in plan.warnings]
    else:
        lines.append("no warnings")
    return "\n".join(lines)


def shell_command(process: ProcessSpec, *, multiline: bool = False) -> str:
    """The process as one shell command (env assignments first), API keys redacted."""
    words = [f"{k}={shlex.quote(v)}" for k, v in redact_env(process.env).items()]
    words += [shlex.quote(a) for a in redact_argv(process.argv)]
    if not multiline:
        return " ".join(words)
    # One `--flag value...` group per line, so a long SGLang command stays readable and pasteable.
    groups: list[list[str]] = [[]]
    for word in words:
        if word.startswith("--"):
            groups.append([])
        groups[-1].append(word)
    return " \\\n    ".join(" ".join(g) for g in groups if g)


def _unset_ports(settings: Settings) -> list[str]:
    launch = settings.launch
    return [
        f"launch.{role}.port" for role, cfg in (("eagle", launch.eagle), ("plain", launch.plain)) if cfg.port is None
    ]
