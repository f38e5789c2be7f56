"""The `specgate` command: `serve` (the gateway), `sim` (a simulated SGLang server), `plan` (SGLang launch plan)."""

from __future__ import annotations

import importlib

import click

# Subcommands live beside the code they drive; they are imported only when invoked, so
# `specgate --help` stays fast and `specgate sim` does not load the gateway.
_COMMANDS = {
    "serve": "gateway.serve:serve_command",
    "sim": "backends.sim.cli:sim_command",
    "plan": "specgate.plan_cli:plan_command",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specgate")
def main() -> None:
    """specgate: route each request to speculative or plain decode by live concurrency."""
