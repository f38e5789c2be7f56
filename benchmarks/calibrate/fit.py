"""Fit a simulator profile's step-time tables to SGLang's own benchmark results.

    python -m benchmarks.calibrate.fit --name mine --plain plain.jsonl --eagle eagle.jsonl --out mine.toml
    specgate sim --profile llama8b-h100 --profile-file mine.toml ...

Each input is the `--output-file` of `python -m sglang.benchmark.serving` (SGLang 0.5.23): one JSON
object per line, one line per run, appended run after run. Run it against each server at several
`--max-concurrency` levels with fixed lengths (`--random-range-ratio 1`, a few hundred output tokens,
ignore EOS), so the running batch stays at the concurrency. Per run it reads:

- the batch: `max_concurrency`, or the measured mean in-flight `concurrency` when none was set;
- the step time: `median_tpot_ms` for a plain server; for an EAGLE server `median_tpot_ms` times the
  acceptance length (`accept_length`, read by bench_serving from `/server_info`, or `--tau`), since a
  speculative step gives each request that many tokens;
- the prefill cost: the slope of `median_ttft_ms` against prompt length (`total_input / completed`)
  over the runs at concurrency 1, when they cover two prompt lengths or more.

Runs at the same batch are combined by their median. The profile file holds only what was fitted
(`step_ms`, `tau`, `prefill_ms_per_token`); every other key comes from the profile it is laid over.
TPOT includes the prefill of requests joining mid-stream, so long outputs give the cleaner step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.calibrate.profile_file import profile_toml


class FitError(ValueError):
    """Benchmark results that cannot give a profile."""


@dataclass(frozen=True)
class Run:
    """What one bench_serving run says about the server's step."""

    batch: int
    tpot_ms: float
    ttft_ms: float
    prompt_tokens: float
    accept_length: float | None


def read_runs(path: Path) -> list[Run]:
    """The runs in one bench_serving output file (JSON lines; a single JSON object also works)."""
    text = path.read_text(encoding="utf-8")
    try:
        records = [json.loads(text)]
    except json.JSONDecodeError:  # the usual case: one object per line
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise FitError(f"{path}: not bench_serving JSON lines: {exc}") from exc
    runs = []
    for i, rec in enumerate(records, 1):
        try:
            batch = rec.get("max_concurrency") or round(float(rec["concurrency"]))
            completed = int(rec["completed"])
            runs.append(
                Run(
                    batch=int(batch),
                    tpot_ms=float(rec["median_tpot_ms"]),
                    ttft_ms=float(rec["median_ttft_ms"]),
                    prompt_tokens=float(rec["total_input"]) / completed if completed else 0.0,
                    accept_length=float(rec["accept_length"]) if rec.get("accept_length") else None,
                )
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise FitError(f"{path} run {i}: missing or malformed bench_serving key ({exc})") from exc
    return runs


def step_table(runs: list[Run], tau: float) -> list[list[float]]:
    """[[batch, step ms], ...]: the median TPOT at each batch times the tokens a step gives a request."""
    by_batch: dict[int, list[float]] = {}
    for run in runs:
        if run.batch >= 1 and run.tpot_ms > 0:
            by_batch.setdefault(run.batch, []).append(run.tpot_ms * tau)
    if not by_batch:
        raise FitError("no run with a batch of at least 1 and a positive median TPOT")
    return [[batch, round(statistics.median(ms), 4)] for batch, ms in sorted(by_batch.items())]


def prefill_slope(runs: list[Run]) -> float | None:
    """Least-squares slope of TTFT against prompt tokens over the concurrency-1 runs, ms per token."""
    points = [(r.prompt_tokens, r.ttft_ms) for r in runs if r.batch == 1]
    if len({round(x) for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return max(round(slope, 6), 0.0)


def acceptance(runs: list[Run], tau: float | None) -> float:
    """The EAGLE server's acceptance length: `tau` if given, else the median that bench_serving recorded."""
    if tau is not None:
        return tau
    seen = [r.accept_length for r in runs if r.accept_length is not None]
    if not seen:
        raise FitError("the EAGLE results carry no accept_length; give --tau")
    return round(statistics.median(seen), 3)


def fit_profile(name: str, plain: list[Run], eagle: list[Run], tau: float | None) -> dict[str, Any]:
    """The fitted tables of a profile file (only the keys the results determine)."""
    profile: dict[str, Any] = {"name": name}
    if plain:
        profile["plain"] = {"step_ms": step_table(plain, 1.0)}
    if eagle:
        eagle_tau = acceptance(eagle, tau)
        profile["eagle"] = {"step_ms": step_table(eagle, eagle_tau), "tau": eagle_tau}
    for role, runs in (("plain", plain), ("eagle", eagle)):
        slope = prefill_slope(runs)
        if slope is not None:
            profile[role]["prefill_ms_per_token"] = slope
    if len(profile) == 1:
        raise FitError("give --plain and/or --eagle result files")
    return profile


def main(argv: list[str] | None = None) -> None:
    """Read the result files, fit, write the profile file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="profile name written into the file")
    parser.add_argument("--plain", type=Path, nargs="*", default=[], help="bench_serving results of the plain server")
    parser.add_argument("--eagle", type=Path, nargs="*", default=[], help="bench_serving results of the EAGLE server")
    parser.add_argument("--tau", type=float, help="EAGLE acceptance length, instead of the recorded accept_length")
    parser.add_argument("--out", type=Path, required=True, help="profile file to write (TOML)")
    args = parser.parse_args(argv)
    try:
        plain = [run for path in args.plain for run in read_runs(path)]
        eagle = [run for path in args.eagle for run in read_runs(path)]
        profile = fit_profile(args.name, plain, eagle, args.tau)
    except (FitError, OSError) as exc:
        raise SystemExit(f"fit: {exc}") from exc
    args.out.write_text(profile_toml(profile), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
