"""The summary table printed at the end of a sweep."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_table(doc: dict[str, Any]) -> Table:
    """One row per level and target with the headline numbers (and envelope ratios if present)."""
    envelope = "envelope" in doc
    table = Table(title=doc.get("title", "Load test summary"))
    for header in ("level", "target", "ok", "err", "req/s", "out tok/s", "TTFT p50", "TPOT p50", "TPOT p99", "ITL p50", "share"):
        table.add_column(header, justify="left" if header in ("level", "target", "share") else "right")
    if envelope:
        table.add_column("tput ratio", justify="right")
        table.add_column("TPOT ratio", justify="right")
    for level in doc["levels"]:
        label = f"C={level['concurrency']}" if level["concurrency"] is not None else f"{level['request_rate']:g}/s"
        for i, (name, t) in enumerate(level["targets"].items()):
            share = ", ".join(f"{k} {v:.0%}" for k, v in (t["backend_share"] or {}).items()) or "-"
            row = [
                label if i == 0 else "",
                name,
                str(t["completed"]),
                str(t["failed"]),
                _num(t["request_s"], 2),
                _num(t["output_tok_s"], 1),
                _num(t["ttft_p50_ms"], 1),
                _num(t["tpot_p50_ms"], 2),
                _num(t["tpot_p99_ms"], 2),
                _num(t["itl_p50_ms"], 2),
                share,
            ]
            if envelope:
                last = i == len(level["targets"]) - 1
                row += [_num(level["throughput_ratio"], 3) if last else "", _num(level["tpot_ratio"], 3) if last else ""]
            table.add_row(*row, end_section=i == len(level["targets"]) - 1)
    return table


def table_console() -> Console:
    """Standard output for the summary table; wide enough for every column when not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=200)
