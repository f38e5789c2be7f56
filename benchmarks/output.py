"""Where a benchmark's markdown report goes: always to stdout, and to `--out` when given."""

from __future__ import annotations

from pathlib import Path

import click


def publish(text: str, out: Path | None) -> None:
    """Print the report and, when `out` is set, write it there (creating its directory)."""
    click.echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
