"""`python -m loadtest`: `sweep` (any OpenAI-compatible servers) and `envelope` (the simulated stack)."""

from __future__ import annotations

import click

from loadtest.envelope_cli import envelope
from loadtest.sweep_cli import sweep


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Concurrency sweeps of OpenAI-compatible servers, with reports and plots."""


main.add_command(sweep)
main.add_command(envelope)
