"""Shifting load: open-loop arrivals whose rate steps low -> high -> low; adaptive vs fixed thresholds.

Every policy gets a fresh simulated stack (`specgate serve --config ...` starting its two
simulated servers, exactly as `python -m loadtest envelope` does) and the identical schedule: the
same prompts sent at the same Poisson arrival times. The rates come from the profile's model, not
from tuning: the low phase keeps a lone EAGLE server busy `--low-busy` of the time, the high phase
asks `--high-load` of the plain server's saturated throughput. The best threshold is picked in
hindsight, by mean TPOT over the whole run, and compared with the adaptive policy.

Usage:
  python benchmarks/shifting_load.py --profile field-8gpu --out docs/benchmarks/shifting-load-field-8gpu
"""

from __future__ import annotations

import random
import shlex
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import matplotlib
import orjson
import uvloop

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from backends.sim.profiles import load_profile  # noqa: E402
from benchmarks.gateway_stack import GatewayStack  # noqa: E402
from loadtest.client import TargetClient, TargetOptions, open_session, served_model  # noqa: E402
from loadtest.envelope.harness import Ports, StackSettings  # noqa: E402
from loadtest.envelope.timescale import CHUNK_BUDGET, MIN_SCALE  # noqa: E402
from loadtest.load import closed_loop, open_loop  # noqa: E402
from loadtest.prompts import PromptFactory  # noqa: E402
from loadtest.records import RequestRecord, RequestSpec  # noqa: E402
from loadtest.stats import request_tpot  # noqa: E402



@dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # requests per wall-clock second (already divided by the time scale)
    seconds: float  # wall-clock


@dataclass(frozen=True)
class Run:
    policy: str
    params: dict[str, Any]

    @property
    def label(self) -> str:
        return self.policy if not self.params else ", ".join(f"{k}={v}" for k, v in self.params.items())


def phases_for(profile_name: str, output_len: int, low_busy: float, high_load: float, seconds: tuple[float, float, float]) -> tuple[list[Phase], float, str]:
    """The low/high/low schedule in wall-clock terms, the time scale, and how the rates were derived."""
    profile = load_profile(profile_name)
    eagle_request = output_len * profile.tpot_s("eagle", 1)  # a lone request on EAGLE, modelled seconds
    low = low_busy / eagle_request
    plain_max = profile.output_throughput("plain", profile.plain.max_running_requests)
    high = high_load * plain_max / output_len
    # The highest chunk rate the sims must sustain: the plain server carrying the high phase.
    scale = max(round(high * output_len / CHUNK_BUDGET, 2), MIN_SCALE)
    how = (
        f"low {low:.2f} req/s (a lone EAGLE request takes {eagle_request:.2f} s: busy {low_busy:.0%}), "
        f"high {high:.2f} req/s ({high_load:.0%} of plain's saturated {plain_max:.0f} tok/s), modelled time; "
        f"time scale {scale:g} (chunk budget {CHUNK_BUDGET:.0f}/s)"
    )
    names = ("low", "high", "low again")
    rates = (low, high, low)
    return [Phase(n, r / scale, s * scale) for n, r, s in zip(names, rates, seconds)], scale, how


def schedule(phases: list[Phase], seed: int) -> list[float]:
    """Arrival offsets (wall seconds) of the whole run: Poisson within each phase."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    start = 0.0
    for phase in phases:
        t = start
        while True:
            t += rng.expovariate(phase.rate)
            if t >= start + phase.seconds:
                break
            arrivals.append(t)
        start += phase.seconds
    return arrivals


async def run_one(
    profile: str, topology: str, run: Run, scale: float, seed: int, eagle_cap: int | None,
    specs: list[RequestSpec], arrivals: list[float], work: Path,
) -> tuple[list[RequestRecord], float, dict[str, Any]]:
    """The schedule through one policy: its records, the run's start time, and the final /admin/status."""
    settings = StackSettings(profile, None, topology, run.policy, run.params, scale, seed, eagle_cap)  # type: ignore[arg-type]
    ports = Ports.pick(topology)  # type: ignore[arg-type]
    async with GatewayStack(settings, ports, work) as stack, open_session(len(specs) + 8, 3600.0) as session:
        client = TargetClient(session, stack.url, await served_model(session, stack.url, None), TargetOptions())
        warmup = list(PromptFactory(specs[0].input_len, 16, seed=seed - 1).take(2))
        await closed_loop(client.send, warmup, concurrency=2)  # as the envelope's warm-up
        result = await open_loop(client.send, specs, arrivals)
        return result.records, result.started, await stack.status()


def summarize(records: list[RequestRecord], started: float, phases: list[Phase]) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    tpots = [t for r in ok if (t := request_tpot(r)) is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    per_phase: dict[str, float | None] = {}
    start = 0.0
    for phase in phases:
        inside = [t for r in ok if start <= r.start - started < start + phase.seconds and (t := request_tpot(r)) is not None]
        per_phase[phase.name] = statistics.fmean(inside) * 1000 if inside else None
        start += phase.seconds
    shares: dict[str, int] = {}
    for r in ok:
        shares[r.backend or "?"] = shares.get(r.backend or "?", 0) + 1
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "tpot_mean_ms": statistics.fmean(tpots) * 1000,
        "tpot_p50_ms": statistics.median(tpots) * 1000,
        "ttft_mean_ms": statistics.fmean(ttfts) * 1000,
        "e2e_mean_ms": statistics.fmean(e2es) * 1000,
        "tpot_mean_ms_by_phase": per_phase,
        "backend_share": {k: v / len(ok) for k, v in sorted(shares.items())},
    }


def timeline(records: list[RequestRecord], started: float, bucket: float) -> tuple[list[float], list[float | None]]:
    """Mean TPOT (ms) of the requests started in each `bucket`-second window."""
    ok = [(r.start - started, t) for r in records if r.ok and (t := request_tpot(r)) is not None]
    end = max(s for s, _ in ok)
    xs, ys = [], []
    t = 0.0
    while t <= end:
        inside = [v for s, v in ok if t <= s < t + bucket]
        xs.append(t + bucket / 2)
        ys.append(statistics.fmean(inside) * 1000 if inside else None)
        t += bucket
    return xs, ys


def plot(path: Path, series: dict[str, tuple[list[float], list[float | None]]], phases: list[Phase], title: str) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, linewidth=2 if label.startswith("adaptive") else 1)
    start = 0.0
    for phase in phases[:-1]:
        start += phase.seconds
        ax.axvline(start, color="grey", linestyle=":")
    ax.set_xlabel("request start (wall seconds into the run)")
    ax.set_ylabel("mean TPOT of requests started (ms)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    rows = [
        f"# Shifting load: {doc['profile']}, {doc['topology']}",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Schedule: {doc['schedule']['how']}. Phases (wall seconds at that scale): "
        + ", ".join(f"{p['name']} {p['seconds']:.0f} s at {p['rate']:.2f} req/s" for p in doc["schedule"]["phases"])
        + f"; {doc['schedule']['requests']} requests, input {doc['input_len']} / output {doc['output_len']} tokens, "
        "identical for every policy. Times below are wall-clock at that time scale (ratios are what carry over).",
        "",
        "| policy | mean TPOT ms | TPOT p50 ms | mean TPOT by phase (low / high / low) | mean TTFT ms | mean e2e ms | share | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"]:
        s = r["summary"]
        phases = " / ".join(f"{v:.2f}" if v is not None else "-" for v in s["tpot_mean_ms_by_phase"].values())
        share = ", ".join(f"{k} {v:.0%}" for k, v in s["backend_share"].items())
        rows.append(
            f"| {r['label']} | {s['tpot_mean_ms']:.2f} | {s['tpot_p50_ms']:.2f} | {phases} | {s['ttft_mean_ms']:.0f} | "
            f"{s['e2e_mean_ms']:.0f} | {share} | {s['failed']} |"
        )
    verdict = doc["verdict"]
    rows += [
        "",
        f"Best fixed threshold in hindsight (by mean TPOT): **{verdict['best_threshold']}**, "
        f"{verdict['best_threshold_tpot_mean_ms']:.2f} ms. Adaptive: **{verdict['adaptive_tpot_mean_ms']:.2f} ms** "
        f"({verdict['ratio']:.3f} x the best threshold; at least as good: {'yes' if verdict['at_least_as_good'] else 'NO'}).",
        "",
        "![mean TPOT over time](tpot-over-time.png)",
        "",
    ]
    return "\n".join(rows)


@click.command()
@click.option("--profile", default="field-8gpu", show_default=True)
@click.option("--topology", type=click.Choice(["partitioned", "colocated"]), default="partitioned", show_default=True)
@click.option("--thresholds", default="0,1,2,4,8,16,32,64", show_default=True, help="fixed thresholds to compare")
@click.option("--low-busy", type=float, default=0.4, show_default=True, help="low phase: share of time a lone EAGLE server is busy")
@click.option("--high-load", type=float, default=0.75, show_default=True, help="high phase: share of plain's saturated throughput")
@click.option("--phase-seconds", default="30,60,30", show_default=True, help="modelled seconds of low, high, low")
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=128, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--eagle-max-running-requests", "eagle_cap", type=click.IntRange(min=1), default=None,
              help="the EAGLE server's running-request cap [default: the profile's], the same for every policy")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def main(profile: str, topology: str, thresholds: str, low_busy: float, high_load: float, phase_seconds: str,
         input_len: int, output_len: int, seed: int, eagle_cap: int | None, out_dir: Path) -> None:
    """Run the schedule through the adaptive policy and each threshold; write results.json, report.md, a plot."""
    seconds = tuple(float(x) for x in phase_seconds.split(","))
    if len(seconds) != 3:
        raise click.BadParameter("three durations: low, high, low", param_hint="--phase-seconds")
    phases, scale, how = phases_for(profile, output_len, low_busy, high_load, seconds)  # type: ignore[arg-type]
    arrivals = schedule(phases, seed)
    specs = list(PromptFactory(input_len, output_len, seed=seed).take(len(arrivals)))
    runs = [Run("adaptive", {})] + [Run("threshold", {"threshold": int(t)}) for t in thresholds.split(",")]
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    series = {}
    for run in runs:
        click.echo(f"{run.label}: {len(specs)} requests over {sum(p.seconds for p in phases):.0f} s ...", err=True)
        records, started, status = uvloop.run(
            run_one(profile, topology, run, scale, seed, eagle_cap, specs, arrivals, out_dir / "logs" / run.label.replace(", ", "_").replace("=", "-"))
        )
        summary = summarize(records, started, phases)
        click.echo(f"  mean TPOT {summary['tpot_mean_ms']:.2f} ms, share {summary['backend_share']}", err=True)
        results.append({"label": run.label, "policy": run.policy, "params": run.params, "summary": summary,
                        "final_policy_status": status["policy"]})
        series[run.label] = timeline(records, started, bucket=sum(p.seconds for p in phases) / 40)
    fixed = [r for r in results if r["policy"] == "threshold"]
    best = min(fixed, key=lambda r: r["summary"]["tpot_mean_ms"])
    adaptive = results[0]["summary"]["tpot_mean_ms"]
    doc = {
        "profile": profile,
        "topology": topology,
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "input_len": input_len,
        "output_len": output_len,
        "eagle_max_running_requests": eagle_cap,
        "schedule": {"how": how, "time_scale": scale, "requests": len(specs),
                     "phases": [{"name": p.name, "rate": p.rate, "seconds": p.seconds} for p in phases]},
        "runs": results,
        "verdict": {
            "best_threshold": best["label"],
            "best_threshold_tpot_mean_ms": best["summary"]["tpot_mean_ms"],
            "adaptive_tpot_mean_ms": adaptive,
            "ratio": adaptive / best["summary"]["tpot_mean_ms"],
            "at_least_as_good": adaptive <= best["summary"]["tpot_mean_ms"],
        },
    }
    (out_dir / "results.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    shown = {k: v for k, v in series.items() if k in ("adaptive", best["label"], "threshold=0")}
    plot(out_dir / "tpot-over-time.png", shown, phases, f"{profile}, {topology}: adaptive vs best threshold")
    (out_dir / "report.md").write_text(markdown(doc))
    shutil.rmtree(out_dir / "logs", ignore_errors=True)  # every run finished: the process logs are for debugging
    click.echo(markdown(doc))


if __name__ == "__main__":
    main()
