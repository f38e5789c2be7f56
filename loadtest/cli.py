"""`python -m loadtest`: `sweep` (any OpenAI-compatible servers) and `envelope` (the simulated stack).

Each subcommand is imported only when it runs, so `sweep` never loads the envelope harness (and
through it the simulator and the gateway's config).
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    """A click group whose subcommands (`commands_by_name`: name -> "module:attribute") are imported on first use.

    The `specgate` command uses it too.
    """

    commands_by_name: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands_by_name)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands_by_name:
            return None
        module, _, attribute = self.commands_by_name[cmd_name].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command


class _Commands(LazyGroup):
    commands_by_name = {"sweep": "loadtest.sweep_cli:sweep", "envelope": "loadtest.envelope.cli:envelope"}


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Concurrency sweeps of OpenAI-compatible servers, with reports and plots."""
