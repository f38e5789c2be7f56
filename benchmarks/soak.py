"""Soak: N requests at concurrency C through `specgate serve` with its simulated backends.

Counts every request as completed (a full response), refused (an OpenAI error the client can act
on) or lost (anything else: a timeout, a cut connection, a stream without `data: [DONE]`), and
samples the gateway's RSS and open file descriptors (its main process and workers) every second. The bounds: 0 lost;
RSS growth under 10% from the baseline sample to the last sample under load; file descriptors
at the end of the load no more than at the baseline plus the slack the connection pools may
still open (they are bounded by the concurrency), and back near their idle level afterwards.

The baseline is taken at the 10th minute (`--baseline 600s`, the full soak's definition) or once
a share of the requests has completed (`--baseline 20%`, the CI soak's proportionate window: the
first fifth of a short run is warm-up, when the pools and allocator are still growing).

    python -m benchmarks.soak --requests 100000 --out docs/benchmarks/reliability-soak.md
    python -m benchmarks.soak --requests 5000 --baseline 20%     # what CI runs (tests/reliability)
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import click
import orjson
import psutil
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready
from benchmarks.output import publish
from loadtest.client import TargetClient, TargetOptions, open_session, served_model
from loadtest.load import closed_loop
from loadtest.prompts import PromptFactory
from loadtest.records import RequestRecord

RSS_GROWTH_LIMIT = 0.10
# Requests the client saw end with an OpenAI error: refused, but not lost.
_CLEAN_ERRORS = ("stream_error",)


@dataclass(frozen=True)
class SoakSettings:
    """What to run."""

    requests: int = 5000
    concurrency: int = 256
    output_len: int = 8
    input_len: int = 16
    time_scale: float = 1.0
    baseline: str = "20%"  # "<seconds>s" into the run, or "<percent>%" of the requests completed
    policy: str = "spill"
    timeout: float = 120.0
    seed: int = 0


@dataclass(frozen=True)
class Sample:
    """One look at the gateway process."""

    at: float  # seconds since the load started
    completed: int
    rss: int  # bytes
    fds: int


@dataclass
class SoakResult:
    """What the soak measured."""

    settings: SoakSettings
    seconds: float = 0.0
    completed: int = 0
    refused: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    baseline: Sample | None = None
    final: Sample | None = None
    idle_fds: int = 0
    inflight_after: float = -1.0
    gateway_counted: float = 0.0

    @property
    def rss_growth(self) -> float:
        assert self.baseline is not None and self.final is not None
        return self.final.rss / self.baseline.rss - 1.0

    @property
    def fd_slack(self) -> int:
        """How far the descriptor count may drift from the baseline as keep-alive connections churn."""
        return max(16, self.settings.concurrency // 4)

    def failures(self) -> list[str]:
        """Every bound that does not hold, as sentences (empty when the soak passed)."""
        out = []
        if self.lost:
            out.append(f"{self.lost} requests lost, e.g. {self.lost_examples[:3]}")
        if self.completed + self.refused + self.lost != self.settings.requests:
            out.append(f"{self.completed + self.refused + self.lost} outcomes for {self.settings.requests} requests")
        if self.baseline is None or self.final is None:
            out.append("no baseline sample: the run ended before the baseline point")
            return out
        if self.rss_growth >= RSS_GROWTH_LIMIT:
            out.append(f"gateway RSS grew {100 * self.rss_growth:.1f}% (limit {100 * RSS_GROWTH_LIMIT:.0f}%)")
        if self.final.fds > self.baseline.fds + self.fd_slack:
            out.append(f"file descriptors grew from {self.baseline.fds} to {self.final.fds}")
        if self.idle_fds > self.baseline.fds:
            out.append(f"{self.idle_fds} file descriptors open once idle, more than under load ({self.baseline.fds})")
        if self.inflight_after != 0:
            out.append(f"in-flight gauge at {self.inflight_after} after the load")
        if self.gateway_counted != self.settings.requests:
            out.append(f"the gateway counted {self.gateway_counted:.0f} requests, not {self.settings.requests}")
        return out


def _classify(record: RequestRecord, expected: int, result: SoakResult) -> None:
    if record.ok and record.completion_tokens == expected:
        result.completed += 1
    elif record.error_kind in _CLEAN_ERRORS or (record.error_kind or "").startswith("http_"):
        result.refused += 1
    else:
        result.lost += 1
        if len(result.lost_examples) < 10:
            result.lost_examples.append(f"{record.error_kind}: {record.error_detail}")


def _baseline_reached(spec: str, sample: Sample, total: int) -> bool:
    if spec.endswith("%"):
        return sample.completed >= total * float(spec[:-1]) / 100
    return sample.at >= float(spec.removesuffix("s"))


def _gateway_usage(proc: psutil.Process) -> tuple[int, int]:
    """(RSS bytes, open fds) of the gateway: its main process and its workers, not the simulators it started."""
    procs = [proc] + [c for c in proc.children(recursive=True) if "backends.sim" not in " ".join(c.cmdline())]
    rss = fds = 0
    for p in procs:
        try:
            rss, fds = rss + p.memory_info().rss, fds + p.num_fds()
        except psutil.NoSuchProcess:  # a worker replaced between the listing and the read
            continue
    return rss, fds


async def _sample(proc: psutil.Process, started: float, result: SoakResult, done: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        sample = Sample(time.monotonic() - started, done[0], *_gateway_usage(proc))
        result.samples.append(sample)
        if result.baseline is None and _baseline_reached(result.settings.baseline, sample, result.settings.requests):
            result.baseline = sample
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


def _gateway_env(settings: SoakSettings) -> dict[str, str]:
    return {
        "SPECGATE_LAUNCH__TIME_SCALE": str(settings.time_scale),
        "SPECGATE_POLICY__NAME": settings.policy,
        "SPECGATE_SERVER__LOG_LEVEL": "warning",
    }


async def _metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    wanted = set(labels.items())
    return sum(
        s.value for family in text_string_to_metric_families(text) for s in family.samples
        if s.name == name and wanted <= set(s.labels.items())
    )


async def run_soak(settings: SoakSettings, log_dir: Path) -> SoakResult:
    """Start `specgate serve` (with its own simulated backends), soak it, stop everything it started."""
    port = free_loopback_port()
    gateway = Child(
        "specgate", [sys.executable, "-m", "gateway", "serve", "--port", str(port)], log_path=log_dir / "gateway.log", env=_gateway_env(settings)
    )
    url = f"http://127.0.0.1:{port}"
    result = SoakResult(settings)
    gateway.start()
    try:
        await wait_until_ready(url, gateway, timeout=90)
        proc = psutil.Process(gateway.pid)
        async with open_session(settings.concurrency + 8, settings.timeout) as session:
            model = await served_model(session, url, None)
            clients = [TargetClient(session, url, model, TargetOptions(stream=stream)) for stream in (True, False)]
            specs = list(PromptFactory(settings.input_len, settings.output_len, seed=settings.seed).take(settings.requests))
            done = [0]
            sent = iter(range(settings.requests))

            async def send(spec: Any) -> RequestRecord:
                # Alternate streamed and whole responses; both are relayed differently.
                record = await clients[next(sent) % 2].send(spec)
                done[0] += 1
                _classify(record, settings.output_len, result)
                return record

            stop = asyncio.Event()
            started = time.monotonic()
            sampler = asyncio.create_task(_sample(proc, started, result, done, stop))
            await closed_loop(send, specs, settings.concurrency)
            result.seconds = time.monotonic() - started
            result.final = Sample(result.seconds, done[0], *_gateway_usage(proc))
            stop.set()
            await sampler
            await session.close()  # the clients' connections close; the gateway's side should follow
            await asyncio.sleep(3.0)
            result.idle_fds = _gateway_usage(proc)[1]
        async with open_session(4, 30) as probe:
            result.inflight_after = await _metric(probe, url, "specgate_inflight_requests")
            result.gateway_counted = await _metric(probe, url, "specgate_requests_total")
    finally:
        await gateway.stop()
    return result


def report(result: SoakResult, command: str) -> str:
    """The soak as markdown: what ran, the counts, memory and descriptors, and the verdict."""
    s = result.settings
    base, final = result.baseline, result.final
    lines = [
        "# Soak through the gateway",
        "",
        f"Command: `{command}`",
        "",
        (f"{s.requests} requests (half streamed, half not; {s.input_len} prompt and {s.output_len} output tokens each) "
        f"at closed-loop concurrency {s.concurrency} through `specgate serve` with its two simulated backends "
        f"(field-8gpu, time scale {s.time_scale:g}, policy {s.policy}), on this machine's 2 shared cores. "
        f"Baseline for memory and descriptors: {baseline_words(s.baseline)}."),
        "",
        "| figure | value |",
        "|---|---|",
        f"| duration | {result.seconds:.0f} s ({s.requests / max(result.seconds, 1e-9):.0f} requests/s) |",
        f"| completed (full response) | {result.completed} |",
        f"| refused (OpenAI error) | {result.refused} |",
        f"| lost | {result.lost} |",
    ]
    if base is not None and final is not None:
        lines += [
            f"| gateway RSS at baseline ({base.at:.0f} s, {base.completed} done) | {base.rss / 2**20:.1f} MiB |",
            f"| gateway RSS at the end of the load | {final.rss / 2**20:.1f} MiB |",
            f"| RSS growth (limit {100 * RSS_GROWTH_LIMIT:.0f}%) | {100 * result.rss_growth:+.1f}% |",
            f"| gateway RSS peak | {max(x.rss for x in result.samples) / 2**20:.1f} MiB |",
            f"| open fds: start / baseline / end of load / idle after | {result.samples[0].fds} / {base.fds} / {final.fds} / {result.idle_fds} |",
        ]
    lines += [f"| in-flight gauge after | {result.inflight_after:g} |", f"| requests the gateway counted | {result.gateway_counted:.0f} |", ""]
    failures = result.failures()
    lines.append("Verdict: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    return "\n".join(lines) + "\n"


def soak_command(settings: SoakSettings) -> str:
    """The command line that runs the soak `settings` describe."""
    return (f"python -m benchmarks.soak --requests {settings.requests} --concurrency {settings.concurrency} "
            f"--output-len {settings.output_len} --time-scale {settings.time_scale:g} --baseline {settings.baseline}")


def baseline_words(spec: str) -> str:
    """The baseline spec in words, for reports."""
    if spec.endswith("%"):
        return f"once {spec} of the requests had completed"
    return f"{float(spec.removesuffix('s')):g} s into the run"


def _check_baseline(_: click.Context, __: click.Parameter, value: str) -> str:
    try:
        number = float(value[:-1])
    except ValueError:
        number = -1.0
    if value[-1:] not in ("s", "%") or number < 0 or (value.endswith("%") and number >= 100):
        raise click.BadParameter("give seconds into the run ('600s') or a share of the requests ('20%')")
    return value


@click.command()
@click.option("--requests", type=click.IntRange(min=1), default=5000, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--baseline", default="20%", show_default=True, callback=_check_baseline,
              help="baseline sample: seconds into the run ('600s') or share of requests done ('20%')")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="also write the report here")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), help="write the samples and counts as JSON")
def main(requests: int, concurrency: int, output_len: int, time_scale: float, baseline: str, out: Path | None, json_out: Path | None) -> None:
    """Soak the gateway and print the report; exit 1 if a bound fails."""
    settings = SoakSettings(requests=requests, concurrency=concurrency, output_len=output_len, time_scale=time_scale, baseline=baseline)
    command = shlex.join(["python", "-m", "benchmarks.soak", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = uvloop.run(run_soak(settings, Path(tmp)))
    text = report(result, command)
    publish(text, out)
    if json_out is not None:
        json_out.write_bytes(orjson.dumps({"settings": settings, "result": result}, option=orjson.OPT_INDENT_2))
    sys.exit(1 if result.failures() else 0)


if __name__ == "__main__":
    main()
