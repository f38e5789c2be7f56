"""One table from several envelope runs of the same profile: each policy's ratios per level side by side.

Reads the `results.json` that `python -m loadtest envelope` wrote for each policy and prints (or
writes) a Markdown table: per concurrency, each run's subject (specgate) throughput / better direct
server and TPOT p50 / better direct server, plus where each run's worst level is.

Usage:
  python -m benchmarks.envelope_compare --run threshold=docs/benchmarks/envelope-field-8gpu \\
      --run spill=docs/benchmarks/envelope-field-8gpu-spill --run adaptive=docs/benchmarks/envelope-field-8gpu-adaptive \\
      --out docs/benchmarks/envelope-field-8gpu-comparison.md
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
import click
import orjson

from benchmarks.output import publish
from loadtest.envelope.comparison import LEGACY_COMPARISON
from loadtest.results import LevelResult, ResultsDocument


def load(path: Path) -> ResultsDocument:
    """An envelope's results.json (given the file or its directory)."""
    file = path / "results.json" if path.is_dir() else path
    try:
        doc = ResultsDocument.load(file)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {file}: {exc.strerror}") from exc
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise click.BadParameter(f"{file} is not a results.json: {exc!r}") from exc
    if doc.envelope is None or not doc.levels:
        raise click.BadParameter(f"{file} is not an envelope's results.json")
    return doc


def ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _subject(doc: ResultsDocument) -> str:
    assert doc.envelope is not None
    return (doc.envelope.comparison or LEGACY_COMPARISON).subject


def _worst(levels: list[LevelResult], key: str, lowest: bool) -> tuple[float, int]:
    """The worst measured ratio and its concurrency: the lowest (throughput) or the highest (TPOT)."""
    measured = [(r, lv.concurrency or 0) for lv in levels if (r := lv.ratios.get(key)) is not None]
    return min(measured) if lowest else max(measured)


def table(runs: dict[str, ResultsDocument]) -> list[str]:
    names = list(runs)
    header = "| C | " + " | ".join(f"{n}: {_subject(runs[n])} tok/s (ratio) | {n}: TPOT p50 ms (ratio)" for n in names) + " |"
    rows = [header, "|---|" + "---|---|" * len(names)]
    levels = sorted({lv.concurrency for doc in runs.values() for lv in doc.levels if lv.concurrency is not None})
    by_level = {n: {lv.concurrency: lv for lv in doc.levels} for n, doc in runs.items()}
    for c in levels:
        cells = []
        for n in names:
            lv = by_level[n].get(c)
            if lv is None:
                cells += ["-", "-"]
                continue
            subject = lv.targets[_subject(runs[n])]
            tpot = "-" if subject.stats.tpot.p50 is None else f"{subject.stats.tpot.p50:.2f}"
            cells += [
                f"{subject.stats.output_tok_s:.0f} ({ratio(lv.ratios.get('throughput_ratio'))})",
                f"{tpot} ({ratio(lv.ratios.get('tpot_ratio'))})",
            ]
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    worst_tp = [_worst(list(by_level[n].values()), "throughput_ratio", lowest=True) for n in names]
    worst_tpot = [_worst(list(by_level[n].values()), "tpot_ratio", lowest=False) for n in names]
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
    docs: dict[str, ResultsDocument] = {}
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
        *(f"- {n}: `{doc.command}`" for n, doc in docs.items()),
        "",
        *table(docs),
        "",
        f"Made with `python -m benchmarks.envelope_compare {shlex.join(sys.argv[1:])}`.",
        "",
    ]
    text = "\n".join(lines)
    publish(text, out)


if __name__ == "__main__":
    main()
