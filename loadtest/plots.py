"""The two pictures of a sweep: output throughput, and TPOT/TTFT p50, against load level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullLocator

_PLAIN = FuncFormatter(lambda v, _: f"{v:g}")


def _x_of(level: dict[str, Any]) -> float:
    return level["concurrency"] if level.get("concurrency") is not None else level["request_rate"]


def _x_label(levels: list[dict[str, Any]]) -> str:
    return "concurrency (closed loop)" if levels[0].get("concurrency") is not None else "request rate (req/s, open loop)"


def _series(levels: list[dict[str, Any]], target: str, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for level in levels:
        value = level["targets"].get(target, {}).get(key)
        if value is not None:
            xs.append(_x_of(level))
            ys.append(value)
    return xs, ys


def _log2_axis(ax: Axes, levels: list[dict[str, Any]]) -> None:
    ticks = sorted({_x_of(lv) for lv in levels})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(_PLAIN)
    ax.set_xlabel(_x_label(levels))
    ax.grid(True, which="major", alpha=0.3)


def _targets(doc: dict[str, Any]) -> list[str]:
    return list(doc["targets"])


def plot_throughput(doc: dict[str, Any], path: Path) -> None:
    """Output tokens/s against load level, one line per target, log2 x axis."""
    levels = doc["levels"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for target in _targets(doc):
        xs, ys = _series(levels, target, "output_tok_s")
        ax.plot(xs, ys, marker="o", label=target)
    _log2_axis(ax, levels)
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(doc.get("title", "Output throughput"))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(doc: dict[str, Any], path: Path) -> None:
    """TPOT p50 and TTFT p50 against load level, one line per target."""
    levels = doc["levels"]
    fig, (tpot_ax, ttft_ax) = plt.subplots(1, 2, figsize=(12, 5))
    panels = ((tpot_ax, "tpot_p50_ms", "TPOT p50 (ms, excl. 1st token)"), (ttft_ax, "ttft_p50_ms", "TTFT p50 (ms)"))
    for ax, key, title in panels:
        drawn = False
        for target in _targets(doc):
            xs, ys = _series(levels, target, key)
            if xs:
                ax.plot(xs, ys, marker="o", label=target)
                drawn = True
        _log2_axis(ax, levels)
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
