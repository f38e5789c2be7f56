"""Benchmark: cells of the profile family through the real gateway, in real time.

`python -m vnode family` checks every member of the synthetic profile family in virtual time. This runs
chosen cells (member x workload) as `python -m loadtest envelope` does: real simulators of the member's
profile (written whole to a file), the real gateway (one worker, as vnode models it) and the
real balancer over HTTP, with the cell's own levels, lengths, arrivals and bounds. Beside each, the same
arguments to `python -m vnode envelope` (each server's own acceptance draws, as the real simulators
draw), and the family's verdict (each request's own draws on every target). Per cell: each bound's
worst level and ratio the three ways, and per level vnode / real for the compared figures.

    python benchmarks/family_realtime.py --cells x8-s3-line-k2:closed,x4-s2-line-k1:poisson \
      --out docs/benchmarks/family-realtime.md --raw docs/benchmarks/family-realtime

`--parallel` runs the cells' real-time envelopes at once (a machine with the cores for them; give a
fixed `--time-scale` then). `--work-dir` keeps the outputs, `--reuse` takes real results already there.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click

from benchmarks.output import publish, run_outputs
from benchmarks.vnode_agreement import GATEWAY_WORKERS, METRICS, cell, compare, envelope, scale_of
from loadtest.envelope.comparison import FAILED, Bound
from loadtest.results import ResultsDocument
from loadtest.sweep import SweepSettings
from vnode.family import Member
from vnode.family_sweep import WORKLOADS, Scale, Workload, cell_document

# A bound as the envelope command's option that sets it.
BOUND_OPTIONS = {
    "throughput_ratio": "--min-throughput-ratio",
    "tpot_ratio": "--max-tpot-ratio",
    "ttft_p50_ratio": "--max-ttft-p50-ratio",
    "e2e_p50_ratio": "--max-e2e-p50-ratio",
    "e2e_p99_ratio": "--max-e2e-p99-ratio",
}


@dataclass(frozen=True)
class FamilyCell:
    """A member under a workload, named `x8-s3-line-k2:closed`."""

    member: Member
    workload: Workload

    @classmethod
    def parse(cls, text: str) -> FamilyCell:
        """Parse `MEMBER:WORKLOAD`; click.BadParameter if either is not the family's."""
        name, _, workload = text.partition(":")
        if workload not in WORKLOADS:
            raise click.BadParameter(f"{text!r}: a cell is MEMBER:WORKLOAD, the workload one of {', '.join(WORKLOADS)}")
        try:
            return cls(Member.parse(name), WORKLOADS[workload])
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    @property
    def name(self) -> str:
        return f"{self.member.name}:{self.workload.name}"


def profile_file(member: Member, directory: Path) -> Path:
    """The member's whole profile as a file in `directory` (the real-time envelope takes a built-in profile
    or a file, not one laid over the other)."""
    path = directory / f"{member.name}-profile.json"
    path.write_text(json.dumps(member.profile().model_dump(mode="json"), indent=1))
    return path


def envelope_args(member: Member, workload: Workload, directory: Path, seed: int = 0) -> tuple[str, ...]:
    """The envelope command's arguments that run `member` under `workload` as the family does (its profile
    written to `directory`)."""
    profile = member.profile()
    settings = workload.settings(profile, member.groups, Scale(), seed)
    args = ["--profile-file", str(profile_file(member, directory)), "--groups", str(member.groups),
            "--gpus-per-group", str(profile.num_gpus), *_sweep_args(settings), *_bound_args(workload.bounds)]
    return tuple(args)


def _sweep_args(s: SweepSettings) -> list[str]:
    first, per_level = s.levels[0], s.requests_per_level
    counts = ["--requests-per-level", f"{per_level.count}{'x' if per_level.per_slot else ''}",
              "--min-requests-per-level", str(per_level.minimum)]
    if first.concurrency is not None:
        args = ["--concurrency", ",".join(str(level.concurrency) for level in s.levels), *counts]
    elif first.rate_step is not None:  # its requests follow from its rates and seconds
        step = first.rate_step
        args = ["--rate-step", f"{step.low:g},{step.high:g},{step.seconds:g}"]
    else:
        args = ["--request-rate", ",".join(f"{level.request_rate:g}" for level in s.levels), *counts]
    args += ["--input-len", str(s.input_len), "--output-len", str(s.output_len), "--warmup", str(s.warmup),
             "--seed", str(s.seed), "--burstiness", f"{s.burstiness:g}"]
    if s.lengths is not None:
        args += ["--length-dist", s.lengths.kind, "--range-ratio", f"{s.lengths.range_ratio:g}",
                 "--length-median-ratio", f"{s.lengths.median_ratio:g}"]
    return args


def _bound_args(bounds: tuple[Bound, ...]) -> list[str]:
    args: list[str] = []
    for bound in bounds:
        if bound.name == FAILED:
            args.append("--no-failed")
        else:
            args += [BOUND_OPTIONS[bound.name], f"{bound.value:g}"]
    return args


def verdicts(doc: ResultsDocument) -> dict[str, tuple[bool, float | None, str]]:
    """Per bound: whether it holds at every level, the worst ratio and its level."""
    assert doc.envelope is not None
    return {c.name: (c.met, c.worst, c.where) for c in doc.envelope.checks}


def _scale_given(doc: ResultsDocument) -> str:
    """The `--time-scale` a real-time run was given: `auto`, or the scale it was set to."""
    note = str((doc.stack or {}).get("time_scale_note") or "")
    return "auto" if note.startswith("auto") else f"{scale_of(doc):g}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cells", "cell_names", default="x8-s3-line-k2:closed", show_default=True,
              help="comma-separated MEMBER:WORKLOAD cells")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--time-scale", default="auto", show_default=True, help="the real-time envelopes' --time-scale")
@click.option("--parallel", is_flag=True, help="run the cells' real-time envelopes at once")
@run_outputs
def main(cell_names: str, seed: int, time_scale: str, parallel: bool, out: Path | None, raw: Path | None,
         work_dir: Path | None, reuse: bool) -> None:
    """Run family cells in real time and in virtual time and compare their verdicts and figures."""
    cells = [FamilyCell.parse(text) for text in cell_names.split(",")]
    work = work_dir or Path(tempfile.mkdtemp(prefix="family-realtime-"))
    work.mkdir(parents=True, exist_ok=True)
    args = {c.name: envelope_args(c.member, c.workload, work, seed) for c in cells}

    def real(c: FamilyCell) -> ResultsDocument:
        target = work / c.name.replace(":", "-") / "real"
        if reuse and (target / "results.json").exists():
            return ResultsDocument.load(target / "results.json")
        return envelope("loadtest", (*args[c.name], "--time-scale", time_scale), target, GATEWAY_WORKERS)

    with ThreadPoolExecutor(max_workers=len(cells) if parallel else 1) as pool:
        reals = dict(zip((c.name for c in cells), pool.map(real, cells), strict=True))
    lines = ["# Family cells in real time", "",
             f"Generated by `python benchmarks/family_realtime.py --cells {cell_names} --seed {seed}"
             + (" --parallel" if parallel else "") + (f" --time-scale {time_scale}" if time_scale != "auto" else "")
             + (f" --out {out}" if out else "") + (f" --raw {raw}" if raw else "")
             + (" --work-dir WORK --reuse` (the real-time results run before, each as its command below says, and "
                "taken from WORK; " if reuse else "` (")
             + "each real-time run's results.json beside it). Per cell: each bound's worst ratio over the levels "
             "(specgate against the best baseline on the same GPUs; bold: it fails) in real time, in vnode on the "
             "same arguments, and in the family's own run (`python -m vnode family`: each request's own draws on "
             "every target); then per level vnode / real.", ""]
    for c in cells:
        doc = reals[c.name]
        model = envelope("vnode", args[c.name], work / c.name.replace(":", "-") / "vnode")
        family = cell_document(c.member, c.workload, Scale(), seed)
        if raw is not None:
            raw.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / c.name.replace(":", "-") / "real" / "results.json", raw / f"{c.name.replace(':', '-')}.json")
        command = shlex.join(["SPECGATE_SERVER__WORKERS=1", "python", "-m", "loadtest", "envelope", *args[c.name],
                              "--time-scale", _scale_given(doc)]).replace(str(work) + "/", "")
        health = "ok" if doc.health.ok else "flagged " + "; ".join(doc.health.flagged)
        lines += [f"## {c.name}", "", f"Real: `{command}` (time scale {scale_of(doc):g}; self-check {health}).", "",
                  "| bound | real | vnode | family |", "|---|---|---|---|"]
        runs = [verdicts(each) for each in (doc, model, family)]
        for name in runs[2]:  # the family's bounds (the command adds its closed-loop defaults to an open loop)
            row = [f"{_ratio(w)} at {a}" if h else f"**{_ratio(w)}** at {a}" for h, w, a in (run[name] for run in runs)]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        table, worst = compare(model, doc)
        lines += ["", "vnode / real per level (" + ", ".join(m.name for m in METRICS) + "; bold: off by more than 5%):",
                  "", *table,
                  "Farthest from 1: " + ", ".join(f"{name} {cell(v)} ({where})" for name, (v, where) in worst.items()) + ".", ""]
    publish("\n".join(lines) + "\n", out)


if __name__ == "__main__":
    main()
