"""Benchmark: how many SSE chunks per second this machine relays before the measurement bends.

Runs the llama8b-h100 plain server at one closed-loop concurrency, directly and through
specgate (threshold policy with threshold 0, so every request goes to plain), at several time
scales, i.e. several modelled chunk rates. For each it prints the measured TPOT p50 against the
model's, the load generator's loop lag, CPU use and the simulator's step lateness. The highest
rate whose numbers stay within the report's limits (and whose TPOT stays within 3% of the model)
is the `CHUNK_BUDGET` that `--time-scale auto` uses.

    python -m benchmarks.chunk_budget [--concurrency 64] [--scales 14,7,5,3.5,2.5]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click
import tomli_w
import uvloop
from rich.console import Console

from backends.process import Child
from backends.readiness import wait_until_ready
from loadtest.envelope.harness import Ports, StackSettings, gateway_config, specgate_executable
from loadtest.envelope.timescale import chunk_rate, profile_for
from loadtest.monitor import CpuMeter, descendants
from loadtest.progress import PlainProgress
from loadtest.slip import SlipProbe
from loadtest.sweep import Level, RequestsPerLevel, Sweep, SweepSettings, Target

PROFILE = "llama8b-h100"


async def _one_scale(scale: float, concurrency: int, rounds: int, output_len: int, work: Path) -> list[dict[str, float]]:
    stack = StackSettings(profile=PROFILE, profile_file=None, topology="partitioned", policy="threshold",
                          policy_params={"threshold": 0}, time_scale=scale)
    ports = Ports.pick("partitioned")
    config = work / f"scale-{scale:g}.toml"
    config.write_text(tomli_w.dumps(gateway_config(stack, ports)))
    gateway = Child("gateway", [specgate_executable(), "serve", "--config", str(config)], log_path=work / f"gateway-{scale:g}.log")
    targets = [Target("plain", f"http://127.0.0.1:{ports.plain}"), Target("specgate", f"http://127.0.0.1:{ports.gateway}")]
    settings = SweepSettings(levels=(Level(concurrency=concurrency),), requests_per_level=RequestsPerLevel(rounds, True),
                             input_len=128, output_len=output_len, warmup=4)
    try:
        gateway.start()
        await wait_until_ready(f"http://127.0.0.1:{ports.plain}", gateway, 120)
        await wait_until_ready(f"http://127.0.0.1:{ports.gateway}", gateway, 120)
        cpu = CpuMeter({"gateway": lambda: [gateway.pid], "sims": lambda: descendants(gateway.pid)})
        async with SlipProbe([targets[0].url]) as slip:
            results = await Sweep(targets, settings, PlainProgress(Console(stderr=True)), cpu, slip).run()
    finally:
        await gateway.stop()
    model = profile_for(PROFILE, None)
    model_tpot_ms = model.tpot_s("plain", concurrency) * 1000 * scale
    rows = []
    for name, result in results[0].targets.items():
        mon = result.monitor
        lateness = mon.sim_lateness_ms()
        rows.append({
            "target": name,
            "scale": scale,
            "chunks_s": chunk_rate(model.plain, concurrency) / scale,
            "tpot_p50_ms": result.stats.tpot.p50 or 0.0,
            "tpot_vs_model": (result.stats.tpot.p50 or 0.0) / model_tpot_ms,
            "loop_lag_p99_ms": mon.loop_lag_p99_ms or 0.0,
            "loadgen_cpu_pct": mon.cpu["loadgen_cpu_pct"],
            "gateway_cpu_pct": mon.cpu["gateway_cpu_pct"],
            "sims_cpu_pct": mon.cpu["sims_cpu_pct"],
            "machine_busy_pct": mon.cpu["machine_busy_pct"],
            "sim_step_lateness_ms": max(lateness) if lateness else 0.0,
        })
    return rows


@click.command()
@click.option("--concurrency", default=64, show_default=True)
@click.option("--scales", default="14,7,5,3.5,2.5", show_default=True, help="time scales to try (larger = slower)")
@click.option("--rounds", default=3, show_default=True, help="requests per worker")
@click.option("--output-len", default=128, show_default=True)
def main(concurrency: int, scales: str, rounds: int, output_len: int) -> None:
    """Print one table row per time scale and target."""
    print(f"{PROFILE} plain server, closed loop C={concurrency}, {rounds} requests per worker, {output_len} output tokens\n")
    print("| time scale | modelled chunks/s | target | TPOT p50 ms | TPOT / model | loop lag p99 ms | loadgen CPU % | "
          "gateway CPU % | sim CPU % | machine busy % | sim step lateness ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (float(s) for s in scales.split(",")):
            for r in uvloop.run(_one_scale(scale, concurrency, rounds, output_len, Path(tmp))):
                print(f"| {r['scale']:g} | {r['chunks_s']:.0f} | {r['target']} | {r['tpot_p50_ms']:.2f} | {r['tpot_vs_model']:.3f} | "
                      f"{r['loop_lag_p99_ms']:.2f} | {r['loadgen_cpu_pct']:.0f} | {r['gateway_cpu_pct']:.0f} | {r['sims_cpu_pct']:.0f} | "
                      f"{r['machine_busy_pct']:.0f} | {r['sim_step_lateness_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
