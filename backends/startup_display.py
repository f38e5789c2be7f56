"""The terminal display of backend startup: one spinner line per backend with its stage and time.

Model loads take minutes; on a terminal the operator sees which server is loading, warming up or
ready. Off a terminal (logs, CI) the supervisor's log records say the same.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn


class StartupDisplay:
    """A live rich display on stderr; `update` is cheap and may be called on every stage change."""

    def __init__(self, names: list[str]) -> None:
        self._progress = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {
            name: self._progress.add_task(f"[bold]{name}[/] waiting to start", total=1, start=False) for name in names
        }

    def __enter__(self) -> StartupDisplay:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, name: str, stage: str, *, done: bool = False) -> None:
        """Show `stage` for backend `name`; `done` stops its clock and ticks it off."""
        task = self._tasks[name]
        self._progress.start_task(task)
        self._progress.update(task, description=f"[bold]{name}[/] {stage}", completed=1 if done else 0)
