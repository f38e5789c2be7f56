"""Benchmark: how much streaming load one simulator process delivers as modelled on this machine.

For each scenario a sim runs as its own process (`python -m backends.sim`, time-scale 1 unless noted) and a
closed loop of C streaming clients (aiohttp, in this process) sends fixed-length chat requests
(`max_tokens`=L, `ignore_eos`) back to back. Per scenario it reports:

- output tok/s measured (sum over clients of completion tokens / own elapsed time) against
  `Profile.closed_loop_throughput` (joining step and prefill included);
- chunk delivery: content events received per request against the steps the model needs per
  request (below 1.0 means the sim, or the client, fell behind and merged steps into one chunk);
- the sim's schedule slip per step (`sglang:sim_schedule_slip_seconds` / `sglang:sim_steps`) and
  its CPU use (psutil), so a CPU-bound sim cannot hide.

A scenario is "sustained" when throughput is within 10% of the model, at least 90% of the modelled
chunks arrive, and the mean slip per step stays under 10% of the modelled step time.

    python benchmarks/sim_capacity.py --out docs/benchmarks/sim-capacity.md
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import click
import orjson
import psutil
import uvloop
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from backends.sim.profiles import Profile, Role, load_profile
from backends.sim.tokenizer import count_chat_tokens
from backends.testbed import SimHandle, start_sim
from benchmarks.output import publish

PROMPT = " ".join(["word"] * 16)
DONE = b"data: [DONE]"
# Events of a chat stream that carry no generated text: role, finish, usage and [DONE].
FRAME_EVENTS = 4


@dataclass(frozen=True)
class Scenario:
    """One measured load point."""

    profile: str
    role: Role
    concurrency: int
    output_tokens: int
    min_seconds: float
    time_scale: float = 1.0


@dataclass
class Outcome:
    """What one scenario measured."""

    scenario: Scenario
    modelled_tok_s: float
    measured_tok_s: float
    chunk_ratio: float
    modelled_chunks_s: float
    slip_per_step_ms: float
    step_ms: float
    sim_cpu: float
    requests: int

    @property
    def sustained(self) -> bool:
        """Within the bounds in the module docstring."""
        return (
            abs(self.measured_tok_s / self.modelled_tok_s - 1) <= 0.10
            and self.chunk_ratio >= 0.90
            and self.slip_per_step_ms <= 0.10 * self.step_ms
        )


def steps_per_request(profile: Profile, role: Role, batch: int, output_tokens: int) -> float:
    """Modelled steps that give one request tokens: its joining step and the decode steps after it."""
    return 1 + (output_tokens - 1) / profile.role(role).tokens_per_step(batch)


def start_scenario_sim(scenario: Scenario, log: Path) -> SimHandle:
    args = ["--role", scenario.role, "--profile", scenario.profile, "--time-scale", str(scenario.time_scale)]
    return start_sim(*args, "--enable-metrics", timeout=30, log_path=log)


def read_slip(url: str) -> tuple[float, float]:
    """(slip seconds, steps) from the sim's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("sglang:sim_schedule_slip_seconds_total", "sglang:sim_steps_total"):
                values[sample.name] = sample.value
    return values["sglang:sim_schedule_slip_seconds_total"], values["sglang:sim_steps_total"]


async def stream_loop(url: str, scenario: Scenario) -> tuple[float, float, int]:
    """Closed loop of streaming clients: (output tok/s, content events per request, requests)."""
    body = orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": scenario.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.monotonic()
        stop_at = start + scenario.min_seconds

        async def client() -> tuple[float, int, int]:
            tokens = events = requests = 0
            while True:
                tail = b""
                async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
                    resp.raise_for_status()
                    async for data in resp.content.iter_any():
                        # Count event starts, also one split across two reads.
                        events += (tail[-5:] + data).count(b"data: ")
                        tail = (tail + data)[-4096:]
                usage_event = tail[: tail.rindex(DONE)].rstrip().rsplit(b"data: ", 1)[1]
                tokens += orjson.loads(usage_event)["usage"]["completion_tokens"]
                events -= FRAME_EVENTS
                requests += 1
                now = time.monotonic()
                if now >= stop_at:
                    return tokens / (now - start), events, requests

        results = await asyncio.gather(*(client() for _ in range(scenario.concurrency)))
    requests = sum(r for _, _, r in results)
    return sum(rate for rate, _, _ in results), sum(e for _, e, _ in results) / requests, requests


def measure(scenario: Scenario, workdir: Path) -> Outcome:
    profile = load_profile(scenario.profile)
    batch = min(scenario.concurrency, profile.role(scenario.role).max_running_requests)
    log = workdir / f"sim-{scenario.profile}-{scenario.role}-{scenario.concurrency}-x{scenario.time_scale:g}.log"
    handle = start_scenario_sim(scenario, log)
    url = handle.url()
    try:
        sim = psutil.Process(handle.pid)
        slip0, steps0 = read_slip(url)
        cpu0, wall0 = sim.cpu_times(), time.monotonic()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            tok_s, events_per_request, requests = runner.run(stream_loop(url, scenario))
        cpu1, wall1 = sim.cpu_times(), time.monotonic()
        slip1, steps1 = read_slip(url)
    finally:
        handle.stop(timeout=15)
    steps = steps_per_request(profile, scenario.role, batch, scenario.output_tokens)
    prompt_tokens = count_chat_tokens([PROMPT])
    modelled = (
        profile.closed_loop_throughput(scenario.role, scenario.concurrency, scenario.output_tokens, prompt_tokens)
        / scenario.time_scale
    )
    return Outcome(
        scenario=scenario,
        modelled_tok_s=modelled,
        measured_tok_s=tok_s,
        chunk_ratio=events_per_request / steps,
        modelled_chunks_s=modelled * steps / scenario.output_tokens,
        slip_per_step_ms=(slip1 - slip0) / max(steps1 - steps0, 1) * 1000,
        step_ms=profile.role(scenario.role).step_ms(batch) * scenario.time_scale,
        sim_cpu=((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (wall1 - wall0),
        requests=requests,
    )


DEFAULT_SCENARIOS = (
    Scenario("field-8gpu", "plain", 256, 64, 40.0),
    Scenario("field-8gpu", "eagle", 48, 128, 20.0),
    Scenario("llama8b-h100", "eagle", 48, 256, 15.0),
    Scenario("llama8b-h100", "plain", 32, 256, 10.0),
    Scenario("llama8b-h100", "plain", 64, 256, 10.0),
    Scenario("llama8b-h100", "plain", 128, 256, 10.0),
    Scenario("llama8b-h100", "plain", 192, 256, 10.0),
    Scenario("llama8b-h100", "plain", 256, 256, 10.0),
    # Past the plain server's cap of 256, only a smaller time scale raises the chunk rate.
    Scenario("llama8b-h100", "plain", 256, 256, 8.0, time_scale=0.7),
    Scenario("llama8b-h100", "plain", 256, 256, 8.0, time_scale=0.5),
    Scenario("llama8b-h100", "plain", 256, 256, 8.0, time_scale=0.35),
    Scenario("llama8b-h100", "plain", 256, 256, 8.0, time_scale=0.25),
    # A measured step-time table (piecewise-linear) rather than a straight line.
    Scenario("h200-llama8b", "eagle", 48, 256, 15.0),
    Scenario("h200-llama8b", "plain", 256, 256, 10.0),
)


def report(outcomes: list[Outcome], command: str) -> str:
    lines = [
        "# Simulator capacity: one sim process under streaming load",
        "",
        f"Command: `{command}`",
        "",
        (
            "One `python -m backends.sim` process per row (time-scale 1 unless the row says), a closed loop of C "
            "streaming chat clients (aiohttp, in the benchmark process) on the same 2-core machine, fixed output "
            "length L, 23 prompt tokens (16 words + chat template). Modelled throughput is "
            "`Profile.closed_loop_throughput`; chunk ratio is content chunks received per request over the modelled "
            "steps per request; slip is the sim's own lateness per step against its modelled timeline. Sustained = "
            "throughput within 10% of the model, chunk ratio >= 0.9 and slip per step <= 10% of the step."
        ),
        "",
        "| profile | role | C | L | time-scale | modelled tok/s | measured tok/s | ratio | modelled chunks/s | chunk ratio | step (ms) | slip/step (ms) | sim CPU | requests | sustained |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        s = o.scenario
        lines.append(
            f"| {s.profile} | {s.role} | {s.concurrency} | {s.output_tokens} | {s.time_scale:g} | {o.modelled_tok_s:.0f} | {o.measured_tok_s:.0f} | "
            f"{o.measured_tok_s / o.modelled_tok_s:.3f} | {o.modelled_chunks_s:.0f} | {o.chunk_ratio:.3f} | {o.step_ms:.2f} | "
            f"{o.slip_per_step_ms:.3f} | {o.sim_cpu:.0%} | {o.requests} | {'yes' if o.sustained else 'no'} |"
        )
    best = max(
        (o for o in outcomes if o.scenario.profile == "llama8b-h100" and o.scenario.role == "plain" and o.sustained),
        key=lambda o: o.modelled_chunks_s,
        default=None,
    )
    lines.append("")
    if best is not None:
        lines.append(
            f"Highest sustained llama8b-h100 plain load here: C={best.scenario.concurrency} at time-scale "
            f"{best.scenario.time_scale:g}, {best.modelled_chunks_s:.0f} chunks/s ({best.measured_tok_s:.0f} tok/s)."
        )
    return "\n".join(lines) + "\n"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="write the markdown report here")
@click.option("--only", multiple=True, help="run only scenarios of this profile (repeatable)")
@click.option(
    "--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("/tmp/sim-capacity"), show_default=True
)
def main(out: Path | None, only: tuple[str, ...], workdir: Path) -> None:
    """Measure one sim process against its model under streaming load (see the module docstring)."""
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console()
    outcomes = []
    for scenario in DEFAULT_SCENARIOS:
        if only and scenario.profile not in only:
            continue
        console.print(
            f"[bold]{scenario.profile} {scenario.role} C={scenario.concurrency} L={scenario.output_tokens} x{scenario.time_scale:g}[/] ..."
        )
        outcome = measure(scenario, workdir)
        console.print(
            f"  {outcome.measured_tok_s:.0f} tok/s vs {outcome.modelled_tok_s:.0f} modelled, chunk ratio {outcome.chunk_ratio:.3f}, "
            f"slip/step {outcome.slip_per_step_ms:.3f} ms, sim CPU {outcome.sim_cpu:.0%} -> {'sustained' if outcome.sustained else 'NOT sustained'}"
        )
        outcomes.append(outcome)
    command = shlex.join(["python", "benchmarks/sim_capacity.py", *sys.argv[1:]])
    text = report(outcomes, command)
    publish(text, out)


if __name__ == "__main__":
    main()
