"""Benchmark: does the virtual-time model (vnode) agree with the real-time envelope it models?

Each run is one same-hardware envelope twice, with the same options: `python -m loadtest envelope`
(real simulators, gateway and balancer over HTTP, at the envelope's own time scale) and `python -m
vnode envelope`. Per level and target it reports vnode / real for output throughput, TPOT p50, TTFT
p50 and E2E p50, the real figures converted to time scale 1. The real request path's fixed latency
is given to vnode as a hop each way (`--hop-ms`), fitted per target at C=1 (half the real TTFT p50
over the hop-less model's) and reused for the open-loop run; everything else is a prediction. The
real gateway runs one worker (`SPECGATE_SERVER__WORKERS=1`), as vnode models it; the default on this
2-core machine is two, each with its own policy. field-8gpu's closed loop runs twice in real time,
to show how far two real runs are apart.

    python benchmarks/vnode_agreement.py --out docs/benchmarks/vnode-agreement.md

`--work-dir` keeps the outputs, `--reuse` takes real-time results already there (about 30 minutes).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from benchmarks.output import publish
from loadtest.results import LevelResult, ResultsDocument
from loadtest.stats import LevelStats

COMMON = ("--input-len", "128", "--output-len", "128", "--warmup", "2", "--seed", "0")
CLOSED = ("--concurrency", "1,2,4,8,16,32,64", "--requests-per-level", "4x", "--min-requests-per-level", "24")
OPEN = ("--request-rate", "1,2,4", "--requests-per-level", "64")
GATEWAY_WORKERS = {"SPECGATE_SERVER__WORKERS": "1"}
AGREE = 0.05


@dataclass(frozen=True)
class Run:
    """One envelope run both ways; `hops_from`: the run whose fitted hops it reuses (None: fit them here);
    `repeat`: run the real-time envelope a second time, to show how far two real runs are apart."""

    name: str
    args: tuple[str, ...]
    hops_from: str | None = None
    repeat: bool = False


RUNS = (
    Run("field-8gpu-k1-closed", ("--profile", "field-8gpu", "--groups", "1", *CLOSED), repeat=True),
    Run("llama8b-h100-k8-closed", ("--profile", "llama8b-h100", "--groups", "8", *CLOSED)),
    Run("field-8gpu-k1-open", ("--profile", "field-8gpu", "--groups", "1", *OPEN), hops_from="field-8gpu-k1-closed"),
)


@dataclass(frozen=True)
class Metric:
    """A compared figure: its name and how to read it at time scale 1 from a target's stats."""

    name: str
    read: Callable[[LevelStats, float], float | None]  # (stats, the run's time scale) -> value at scale 1


METRICS = (
    Metric("throughput", lambda st, scale: st.output_tok_s * scale),
    Metric("TPOT p50", lambda st, scale: None if st.tpot.p50 is None else st.tpot.p50 / scale),
    Metric("TTFT p50", lambda st, scale: None if st.ttft.p50 is None else st.ttft.p50 / scale),
    Metric("E2E p50", lambda st, scale: None if st.e2e.p50 is None else st.e2e.p50 / scale),
)


def envelope(program: str, args: Sequence[str], out: Path, env: dict[str, str] | None = None) -> ResultsDocument:
    """Run `python -m PROGRAM envelope ARGS --out OUT` (its bounds may fail: exit 1 still wrote the results)."""
    argv = [sys.executable, "-m", program, "envelope", *args, "--out", str(out)]
    done = subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1) or not (out / "results.json").exists():
        raise click.ClickException(f"{shlex.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return ResultsDocument.load(out / "results.json")


def scale_of(doc: ResultsDocument) -> float:
    """The time scale a results document was measured at (1 for the model)."""
    return float((doc.stack or {}).get("time_scale") or 1.0)


def fitted_hops(real: ResultsDocument, model: ResultsDocument) -> dict[str, float]:
    """Per target, model seconds each way: half the real TTFT p50 over the hop-less model's, at the first level."""
    scale = scale_of(real)
    first_real, first_model = real.levels[0], model.levels[0]
    hops = {}
    for name, result in first_real.targets.items():
        real_ttft, model_ttft = result.stats.ttft.p50, first_model.targets[name].stats.ttft.p50
        if real_ttft is not None and model_ttft is not None:
            hops[name] = max(0.0, (real_ttft / scale - model_ttft) / 2.0 / 1000.0)  # TTFTs are in ms
    return hops


def ratio(mine: LevelResult, theirs: LevelResult, name: str, metric: Metric, scales: tuple[float, float]) -> float | None:
    """`mine` / `theirs` for one target and metric, each read at its own time scale."""
    a, b = metric.read(mine.targets[name].stats, scales[0]), metric.read(theirs.targets[name].stats, scales[1])
    return a / b if a is not None and b else None


def cell(value: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.3f}"
    return f"**{text}**" if abs(value - 1.0) > AGREE else text


def compare(mine: ResultsDocument, *theirs: ResultsDocument) -> tuple[list[str], dict[str, tuple[float, str]]]:
    """A table of `mine` / `theirs` per level, target and metric (with several `theirs`, the ratio to the nearest),
    and per metric the worst ratio (farthest from 1)."""
    lines = ["| level | target | " + " | ".join(m.name for m in METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
    worst: dict[str, tuple[float, str]] = {}
    for level_mine, *levels_theirs in zip(mine.levels, *(t.levels for t in theirs), strict=True):
        for name in levels_theirs[0].targets:
            values = [_nearest([ratio(level_mine, level, name, m, (scale_of(mine), scale_of(doc)))
                                for level, doc in zip(levels_theirs, theirs, strict=True)]) for m in METRICS]
            label = levels_theirs[0].label
            lines.append(f"| {label} | {name} | " + " | ".join(cell(v) for v in values) + " |")
            for metric, value in zip(METRICS, values, strict=True):
                if value is not None and (metric.name not in worst or abs(value - 1) > abs(worst[metric.name][0] - 1)):
                    worst[metric.name] = (value, f"{label} {name}")
    return [*lines, ""], worst


def _nearest(values: list[float | None]) -> float | None:
    """The ratio closest to 1 (None where none was measured)."""
    measured = [v for v in values if v is not None]
    return min(measured, key=lambda v: abs(v - 1.0)) if measured else None


def describe(run: Run, real: ResultsDocument, hops: dict[str, float], fitted: bool, commands: tuple[str, str]) -> list[str]:
    """The run's commands, the real envelope's time scale and health, and the hops the model was given."""
    scale = scale_of(real)
    how = "fitted at C=1 here" if fitted else f"taken from {run.hops_from}"
    return [f"### {run.name}", "", f"Real: `{commands[0]}`", "", f"Model: `{commands[1]}`", "",
            f"Real-time envelope at time scale {scale:g}; its self-check: "
            + ("ok" if real.health.ok else "flagged " + "; ".join(real.health.flagged)) + ".", "",
            f"Hop each way ({how}): " + ", ".join(
                f"{name} {s * 1000:.2f} model ms ({s * 1000 * scale:.2f} wall ms)" for name, s in hops.items()) + ".", ""]


def headline_row(label: str, worst: dict[str, tuple[float, str]]) -> str:
    return f"| {label} | " + " | ".join(
        f"{worst[m.name][0]:.3f} ({worst[m.name][1]})" if m.name in worst else "-" for m in METRICS) + " |"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write the report here")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="keep both envelopes' outputs here [default: a temporary directory]")
@click.option("--reuse", is_flag=True, help="use real-time results already in --work-dir")
@click.option("--runs", "run_names", default=",".join(r.name for r in RUNS), show_default=True)
def main(out: Path | None, work_dir: Path | None, reuse: bool, run_names: str) -> None:
    """Run the real-time and the virtual-time envelope on the same settings and compare them level by level."""
    chosen = [r for r in RUNS if r.name in run_names.split(",")]
    work = work_dir or Path(tempfile.mkdtemp(prefix="vnode-agreement-"))
    sections: list[str] = []
    headline = ["| run | " + " | ".join(m.name for m in METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    hops_of: dict[str, dict[str, float]] = {}
    def real_run(args: tuple[str, ...], out: Path) -> ResultsDocument:
        if reuse and (out / "results.json").exists():
            return ResultsDocument.load(out / "results.json")
        return envelope("loadtest", args, out, GATEWAY_WORKERS)

    for run in chosen:
        args = (*run.args, *COMMON)
        real_command = shlex.join(["SPECGATE_SERVER__WORKERS=1", "python", "-m", "loadtest", "envelope", *args])
        real = real_run(args, work / run.name / "real")
        fitted = run.hops_from is None
        if fitted:
            bare = envelope("vnode", args, work / run.name / "model-no-hop")
            hops_of[run.name] = fitted_hops(real, bare)
        source = run.name if fitted else run.hops_from or ""
        if source not in hops_of:
            raise click.UsageError(f"run {run.name} takes its hops from {source}: run that one too")
        hops = hops_of[source]
        hop_args = tuple(a for name, s in hops.items() for a in ("--hop-ms", f"{name}={s * 1000:.4f}"))
        model = envelope("vnode", (*args, *hop_args), work / run.name / "model")
        model_command = shlex.join(["python", "-m", "vnode", "envelope", *args, *hop_args])
        table, worst = compare(model, real)
        sections += describe(run, real, hops, fitted, (real_command, model_command)) + table
        headline.append(headline_row(run.name, worst))
        if run.repeat:
            again = real_run(args, work / run.name / "real-again")
            table, worst = compare(again, real)
            check = "ok" if again.health.ok else "flagged " + "; ".join(again.health.flagged)
            sections += ["The same real-time envelope run again, against the first run (real / real): how far the "
                         f"harness's own runs are apart (its self-check: {check}).", "", *table]
            headline.append(headline_row(f"{run.name}: real run again / real", worst))
            table, worst = compare(model, real, again)
            sections += ["vnode against whichever of the two real runs is nearer, per level, target and metric.", "",
                         *table]
            headline.append(headline_row(f"{run.name}: vnode / the nearer real run", worst))
    text = "\n".join([
        "# vnode against the real-time envelope",
        "",
        "Generated by `python benchmarks/vnode_agreement.py --out docs/benchmarks/vnode-agreement.md` "
        f"(the model and the real simulators at the same seed; bold: more than {AGREE:.0%} apart).",
        "",
        "Each cell is vnode / real for one target at one level: output throughput, TPOT p50, TTFT p50 and E2E p50, "
        "the real-time figures converted to time scale 1. The real request path's latency is fitted per target at "
        "C=1 (the hop, each way) and reused for the open-loop run; the real gateway runs one worker, as the model does.",
        "",
        "How to read TTFT p50 under a closed loop of fixed lengths: requests that start in one step end in one step, "
        "and their clients' next requests join one step together, so the batch moves in cohorts whose sizes are "
        "set by how the level's first requests happened to reach the server (over HTTP, one after another, within "
        "the first steps) and then persist. A request's TTFT is the prefill of its whole cohort, so the TTFT "
        "distribution has one mode per cohort size and its median jumps between them from one run to the next; "
        "the TPOT of requests whose decode spans other cohorts' joining steps moves a few % with it. The field-8gpu "
        "closed-loop envelope is run twice in real time to show how far two real runs are apart.",
        "",
        "## Worst ratio per metric (farthest from 1)",
        "",
        *headline,
        "",
        "## Per level",
        "",
        *sections,
    ])
    publish(text, out)


if __name__ == "__main__":
    main()
