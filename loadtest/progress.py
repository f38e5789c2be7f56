"""Showing a sweep as it runs: rich progress bars on a terminal, one plain line per level otherwise."""

from __future__ import annotations

from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from loadtest.records import RequestRecord
from loadtest.stats import LevelStats
from loadtest.sweep import Level


def _summary(target: str, level: Level, stats: LevelStats) -> str:
    tpot = "-" if stats.tpot.p50 is None else f"{stats.tpot.p50:.2f}"
    ttft = "-" if stats.ttft.p50 is None else f"{stats.ttft.p50:.1f}"
    errors = f" errors={sum(stats.errors.values())}" if stats.errors else ""
    return (
        f"{target:>10} {level.label:>10}: {stats.completed} ok, {stats.output_tok_s:8.1f} out tok/s, "
        f"TPOT p50 {tpot} ms, TTFT p50 {ttft} ms{errors}"
    )


class PlainProgress:
    """One line per finished level, for logs and CI (no terminal control codes)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def level_started(self, target: str, level: Level, total: int) -> None:
        """Nothing to show until the level ends."""

    def request_done(self, record: RequestRecord) -> None:
        """Nothing to show per request."""

    def level_finished(self, target: str, level: Level, stats: LevelStats) -> None:
        """Print the level's headline numbers."""
        self.console.print(_summary(target, level, stats), highlight=False, soft_wrap=True)


class RichProgress:
    """A live bar per target and level, with the headline numbers printed above as levels end."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[errors]}"),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._errors = 0

    def __enter__(self) -> Self:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def level_started(self, target: str, level: Level, total: int) -> None:
        """Add a bar for this target and level."""
        self._errors = 0
        self._task = self._bars.add_task(f"{target} {level.label}", total=total, errors="")

    def request_done(self, record: RequestRecord) -> None:
        """Advance the current bar."""
        if self._task is None:
            return
        if not record.ok:
            self._errors += 1
        self._bars.update(self._task, advance=1, errors=f"[red]{self._errors} failed" if self._errors else "")

    def level_finished(self, target: str, level: Level, stats: LevelStats) -> None:
        """Replace the finished bar with the level's headline numbers."""
        if self._task is not None:
            self._bars.remove_task(self._task)
            self._task = None
        self._bars.console.print(_summary(target, level, stats), highlight=False, soft_wrap=True)


def progress_for(console: Console) -> PlainProgress | RichProgress:
    """Rich bars on an interactive terminal, plain lines otherwise."""
    return RichProgress(console) if console.is_terminal else PlainProgress(console)
