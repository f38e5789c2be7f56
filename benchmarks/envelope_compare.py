"""One table from several envelope runs of the same profile: each policy's ratios per level side by side.

Reads the `results.json` that `python -m loadtest envelope` wrote for each policy and prints (or
writes) a Markdown table: per concurrency, each run's specgate throughput / better direct server
and TPOT p50 / better direct server, plus where each run's worst level is.

Usage:
  python benchmarks/envelope_compare.py --run threshold=docs/benchmarks/envelope-field-8gpu \\
      --run spill=docs/benchmarks/envelope-field-8gpu-spill --run adaptive=docs/benchmarks/envelope-field-8gpu-adaptive \\
      --out docs/benchmarks/envelope-field-8gpu-comparison.md
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
import orjson

from benchmarks.output import publish


def load(path: Path) -> dict[str, Any]:
    """An envelope's results.json (given the file or its directory)."""
    file = path / "results.json" if path.is_dir() else path
    try:
        doc: dict[str, Any] = orjson.loads(file.read_bytes())
    except OSError as exc:
        raise click.BadParameter(f"cannot read {file}: {exc.strerror}") from exc
    if not doc.get("levels") or "throughput_ratio" not in doc["levels"][0]:
        raise click.BadParameter(f"{file} is not an envelope's results.json")
    return doc


def ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def table(runs: dict[str, dict[str, Any]]) -> list[str]:
    names = list(runs)
    header = "| C | " + " | ".join(f"{n}: specgate tok/s (ratio) | {n}: TPOT p50 ms (ratio)" for n in names) + " |"
    rows = [header, "|---|" + "---|---|" * len(names)]
    levels = sorted({lv["concurrency"] for doc in runs.values() for lv in doc["levels"]})
    by_level = {n: {lv["concurrency"]: lv for lv in doc["levels"]} for n, doc in runs.items()}
    for c in levels:
        cells = []
        for n in names:
            lv = by_level[n].get(c)
            if lv is None:
                cells += ["-", "-"]
                continue
            spec = lv["targets"]["specgate"]
            cells += [
                f"{spec['output_tok_s']:.0f} ({ratio(lv['throughput_ratio'])})",
                f"{spec['tpot_p50_ms']:.2f} ({ratio(lv['tpot_ratio'])})",
            ]
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    worst_tp = [min((lv["throughput_ratio"], lv["concurrency"]) for lv in by_level[n].values()) for n in names]
    worst_tpot = [max((lv["tpot_ratio"], lv["concurrency"]) for lv in by_level[n].values()) for n in names]
    rows.append(
        "| worst ratio | "
        + " | ".join(f"{tp[0]:.3f} (C={tp[1]}) | {tpot[0]:.3f} (C={tpot[1]})" for tp, tpot in zip(worst_tp, worst_tpot))
        + " |"
    )
    return rows


@click.command()
@click.option("--run", "runs", multiple=True, required=True, metavar="NAME=PATH", help="an envelope run (repeatable)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(runs: tuple[str, ...], out: Path | None) -> None:
    """Compare envelope runs level by level."""
    docs: dict[str, dict[str, Any]] = {}
    for text in runs:
        name, sep, path = text.partition("=")
        if not sep:
            raise click.BadParameter(f"expected NAME=PATH, got {text!r}", param_hint="--run")
        docs[name] = load(Path(path))
    lines = [
        "Specgate's own output throughput and TPOT p50 per run (wall-clock, at each run's simulator time scale), and in "
        "brackets the run's envelope ratios: specgate / the better direct server of that run (throughput: higher is "
        "better; TPOT: lower is better). Runs:",
        "",
        *(f"- {n}: `{doc['command']}`" for n, doc in docs.items()),
        "",
        *table(docs),
        "",
        f"Made with `python {' '.join(shlex.quote(a) for a in sys.argv)}`.",
        "",
    ]
    text = "\n".join(lines)
    publish(text, out)


if __name__ == "__main__":
    main()
