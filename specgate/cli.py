"""The `specgate` command: `serve` (the gateway), `sim` (a simulated SGLang server), `plan` (a launch plan, or a node's layout for traffic)."""

from __future__ import annotations

import click

from loadtest.cli import LazyGroup


class _Commands(LazyGroup):
    # Subcommands live beside the code they drive; they are imported only when invoked, so
    # `specgate --help` stays fast and `specgate sim` does not load the gateway.
    commands_by_name = {
        "serve": "gateway.serve:serve_command",
        "sim": "backends.sim.cli:sim_command",
        "plan": "specgate.plan_cli:plan_command",
    }


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specgate")
def main() -> None:
    """specgate: route each request to speculative or plain decode by live concurrency."""
