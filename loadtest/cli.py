"""`python -m loadtest`: `sweep` (any OpenAI-compatible servers) and `envelope` (the simulated stack).

Each subcommand is imported only when it runs, so `sweep` never loads the envelope harness (and
through it the simulator and the gateway's config).
"""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of the click command.
COMMANDS = {
    "sweep": "loadtest.sweep_cli:sweep",
    "envelope": "loadtest.envelope.cli:envelope",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attribute = COMMANDS[cmd_name].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Concurrency sweeps of OpenAI-compatible servers, with reports and plots."""
