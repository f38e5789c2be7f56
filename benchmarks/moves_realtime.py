"""Benchmark: a stream-moving rule in real time. The same-hardware envelope through the real gateway with
the rule on and off, on the same seed: specgate's ratios to the best baseline each way, and the moves its
access log recorded.

Each run is `python -m loadtest envelope` (real simulators, gateway and baselines over HTTP, each target
alone on its own servers); the gateway runs one worker, as the virtual node models it. The rules:

- `moves` (rule 7, `adaptive_move_running`): field-8gpu K=1, open loop at 10% and 18% of plain-dp's
  capacity (0.54 and 1 req/s of 128-token prompts and answers), where the virtual node puts its gain.
- `handover` (rule 8, `adaptive_handover`): llama8b-h100 K=8 x 1 GPU, multi-turn at 90% of plain-dp's
  capacity (18.41 req/s, 256 requests), the headline cell's heaviest rate (real-traffic.md) run from a
  fresh start; the baselines behind the balancer and behind SMG cache_aware (needs `smg`, found as
  `python -m loadtest envelope` finds it). 16 simulated servers a target: a machine of 16 cores.

    python benchmarks/moves_realtime.py --out docs/benchmarks/moves-realtime.md --raw docs/benchmarks/moves-realtime
    python benchmarks/moves_realtime.py --rule handover --parallel --time-scale 1.26 \
      --out docs/benchmarks/handover-realtime.md --raw docs/benchmarks/handover-realtime

`--parallel` runs the two envelopes at once (a machine with the cores for both; give a fixed
`--time-scale` then, since each run's auto scale measures a machine the other one shares). `--work-dir`
keeps the outputs, `--reuse` takes results already there.
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
from benchmarks.vnode_agreement import GATEWAY_WORKERS, envelope, scale_of
from loadtest.results import LevelResult, ResultsDocument
from loadtest.stats import LevelStats

COMMON = ("--warmup", "2", "--seed", "0")
COLUMNS = ("tok/s", "TTFT p50", "TPOT p50", "E2E p50", "E2E p99")
SUBJECT = "specgate"


@dataclass(frozen=True)
class Rule:
    """A rule, the policy parameter that turns it on, and the envelope that shows it."""

    title: str
    param: str
    args: tuple[str, ...]


RULES = {
    "moves": Rule("Rule 7 in real time: the envelope with and without moves", "adaptive_move_running",
                  ("--profile", "field-8gpu", "--groups", "1", "--request-rate", "0.54,1", "--requests-per-level", "128",
                   "--input-len", "128", "--output-len", "128")),
    "handover": Rule("Rule 8 in real time: the envelope with and without handovers", "adaptive_handover",
                     ("--profile", "llama8b-h100", "--groups", "8", "--gpus-per-group", "1", "--dataset", "multi-turn",
                      "--request-rate", "18.41", "--requests-per-level", "256", "--baseline-router", "both")),
}


def figures(st: LevelStats, scale: float) -> tuple[float | None, ...]:
    """A target's columns at time scale 1 (latencies in model ms)."""
    def at(value: float | None) -> float | None:
        return None if value is None else value / scale

    return st.output_tok_s * scale, at(st.ttft.p50), at(st.tpot.p50), at(st.e2e.p50), at(st.e2e.p99)


def baselines(level: LevelResult) -> list[str]:
    return [name for name in level.targets if name != SUBJECT]


def ratios(level: LevelResult, scale: float) -> tuple[float | None, ...]:
    """specgate's columns over the best baseline's (the highest tok/s, the lowest latency)."""
    mine = figures(level.targets[SUBJECT].stats, scale)
    best = [figures(level.targets[b].stats, scale) for b in baselines(level)]
    out: list[float | None] = []
    for i, value in enumerate(mine):
        theirs = [row[i] for row in best if row[i] is not None]
        if value is None or not theirs:
            out.append(None)
            continue
        out.append(value / max(theirs) if i == 0 else value / min(theirs))
    return tuple(out)


def moves(out: Path) -> int:
    """Streams the gateway's access log says another backend went on with."""
    log = out / "logs" / "specgate.log"
    count = 0
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("moved_from"):
            count += 1
    return count


def cells(values: tuple[float | None, ...], fmt: str) -> str:
    return " | ".join("-" if v is None else format(v, fmt) for v in values)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rule", type=click.Choice(sorted(RULES)), default="moves", show_default=True, help="the rule to run on and off")
@click.option("--time-scale", default="auto", show_default=True, help="the envelopes' --time-scale")
@click.option("--parallel", is_flag=True, help="run both envelopes at once")
@run_outputs
def main(rule: str, time_scale: str, parallel: bool, out: Path | None, raw: Path | None, work_dir: Path | None,
         reuse: bool) -> None:
    """Run the envelope with the rule on and off and compare specgate's ratios level by level."""
    chosen = RULES[rule]
    work = work_dir or Path(tempfile.mkdtemp(prefix=f"{rule}-realtime-"))
    variants = {rule: "true", f"no-{rule}": "false"}
    commands: dict[str, str] = {}

    def run(name: str) -> ResultsDocument:
        args = (*chosen.args, *COMMON, "--time-scale", time_scale, "--policy-param", f"{chosen.param}={variants[name]}")
        commands[name] = shlex.join(["SPECGATE_SERVER__WORKERS=1", "python", "-m", "loadtest", "envelope", *args])
        target = work / name
        if reuse and (target / "results.json").exists():
            return ResultsDocument.load(target / "results.json")
        return envelope("loadtest", args, target, GATEWAY_WORKERS)

    with ThreadPoolExecutor(max_workers=len(variants) if parallel else 1) as pool:
        docs = dict(zip(variants, pool.map(run, variants), strict=True))
    if raw is not None:
        raw.mkdir(parents=True, exist_ok=True)
        for name in docs:
            shutil.copyfile(work / name / "results.json", raw / f"{name}-results.json")
    how = f"--rule {rule} " if rule != "moves" else ""
    how += ("--parallel " if parallel else "") + (f"--time-scale {time_scale} " if time_scale != "auto" else "")
    lines = [f"# {chosen.title}", "",
             f"Generated by `python benchmarks/moves_realtime.py {how}--out docs/benchmarks/{rule}-realtime.md "
             f"--raw docs/benchmarks/{rule}-realtime` (raw results.json of each run beside it). Runs:", ""]
    for name, doc in docs.items():
        health = "ok" if doc.health.ok else "flagged " + "; ".join(doc.health.flagged)
        lines.append(f"- {name}: `{commands[name]}` (time scale {scale_of(doc):g}; self-check {health}; "
                     f"{moves(work / name)} streams moved)")
    first_name, first = next(iter(docs.items()))
    lines += ["", "Figures at time scale 1 (model ms). Ratios: specgate over the best baseline (highest tok/s, "
              "lowest latency) of the same run; the baselines run the same way in both.", "",
              "| level | target | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for i, level in enumerate(first.levels):
        scale = scale_of(first)
        for b in baselines(level):
            lines.append(f"| {level.label} | {b} ({first_name} run) | {cells(figures(level.targets[b].stats, scale), '.2f')} |")
        for name, doc in docs.items():
            mine = doc.levels[i]
            lines.append(f"| {mine.label} | specgate, {name} | {cells(figures(mine.targets[SUBJECT].stats, scale_of(doc)), '.2f')} |")
        for name, doc in docs.items():
            lines.append(f"| {level.label} | *specgate / best, {name}* | {cells(ratios(doc.levels[i], scale_of(doc)), '.3f')} |")
    publish("\n".join(lines) + "\n", out)


if __name__ == "__main__":
    main()
