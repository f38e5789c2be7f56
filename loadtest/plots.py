"""The two pictures of a sweep: output throughput, and TPOT/TTFT p50, against load level."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullLocator

from loadtest.results import LevelResult, ResultsDocument, TargetResult

_PLAIN = FuncFormatter(lambda v, _: f"{v:g}")


def _x_label(levels: Sequence[LevelResult]) -> str:
    if levels[0].concurrency is not None:
        return "concurrency (closed loop)"
    return "offered request rate (req/s, trace replay)" if levels[0].trace_time_scale is not None else "request rate (req/s, open loop)"


def _log2_axis(ax: Axes, levels: Sequence[LevelResult]) -> None:
    ticks = sorted({lv.x for lv in levels if lv.x is not None and math.isfinite(lv.x)})
    if ticks:  # none when every level is an infinite rate (all requests at once)
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(_PLAIN)
    ax.set_xlabel(_x_label(levels))
    ax.grid(True, which="major", alpha=0.3)


def plot_throughput(doc: ResultsDocument, path: Path) -> None:
    """Output tokens/s against load level, one line per target, log2 x axis."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for target in doc.targets:
        xs, ys = doc.series(target).values(lambda t: t.stats.output_tok_s)
        ax.plot(xs, ys, marker="o", label=target)
    _log2_axis(ax, doc.levels)
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(doc.title or "Output throughput")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(doc: ResultsDocument, path: Path) -> None:
    """TPOT p50 and TTFT p50 against load level, one line per target."""
    fig, (tpot_ax, ttft_ax) = plt.subplots(1, 2, figsize=(12, 5))
    panels: tuple[tuple[Axes, Callable[[TargetResult], float | None], str], ...] = (
        (tpot_ax, lambda t: t.stats.tpot.p50, "TPOT p50 (ms, excl. 1st token)"),
        (ttft_ax, lambda t: t.stats.ttft.p50, "TTFT p50 (ms)"),
    )
    for ax, metric, title in panels:
        drawn = False
        for target in doc.targets:
            xs, ys = doc.series(target).values(metric)
            if xs:
                ax.plot(xs, ys, marker="o", label=target)
                drawn = True
        _log2_axis(ax, doc.levels)
        ax.set_title(title)
        if drawn:
            ax.set_yscale("log")
            # Plain numbers; minor ticks labelled only where the axis spans few decades.
            ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
            ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.6)))
            ax.legend()
        else:  # e.g. TPOT of a non-streamed sweep
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
