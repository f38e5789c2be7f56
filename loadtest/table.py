"""The summary table printed at the end of a sweep."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from loadtest.report import fixed, share_text
from loadtest.results import ResultsDocument


def _ratio_header(key: str) -> str:
    """`throughput_ratio` -> `throughput ratio`, with the envelope's usual short forms."""
    return {"throughput_ratio": "tput ratio", "tpot_ratio": "TPOT ratio"}.get(key, key.replace("_", " "))


def summary_table(doc: ResultsDocument) -> Table:
    """One row per level and target with the headline numbers, and each level's ratios if it has any."""
    ratio_keys = list(dict.fromkeys(k for level in doc.levels for k in level.ratios))
    table = Table(title=doc.title or "Load test summary")
    for header in ("level", "target", "ok", "err", "req/s", "out tok/s", "TTFT p50", "TPOT p50", "TPOT p99", "ITL p50", "share"):
        table.add_column(header, justify="left" if header in ("level", "target", "share") else "right")
    for key in ratio_keys:
        table.add_column(_ratio_header(key), justify="right")
    for level in doc.levels:
        for i, (name, t) in enumerate(level.targets.items()):
            last = i == len(level.targets) - 1
            row = [
                level.label if i == 0 else "",
                name,
                str(t.stats.completed),
                str(t.stats.failed),
                fixed(t.stats.request_s, 2),
                fixed(t.stats.output_tok_s, 1),
                fixed(t.stats.ttft.p50, 1),
                fixed(t.stats.tpot.p50, 2),
                fixed(t.stats.tpot.p99, 2),
                fixed(t.stats.itl.p50, 2),
                share_text(t.stats.backend_share),
            ]
            row += [_figure(level.ratios.get(key)) if last else "" for key in ratio_keys]
            table.add_row(*row, end_section=last)
    return table


def _figure(value: float | None) -> str:
    """A level's ratio to 3 decimals, a count (failed requests) as it is."""
    return str(value) if isinstance(value, int) else fixed(value, 3)


def table_console() -> Console:
    """Standard output for the summary table; wide enough for every column when not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=200)
