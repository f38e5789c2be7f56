"""Benchmark: what a gateway costs over calling the backend directly; specgate beside nginx and SMG.

One Python aiohttp upstream (benchmarks/sse_source.py --lockstep --instant) answers non-streamed
requests at once and streams a chunk every `--step` to all open streams in lockstep, like a batched
decode step. In ONE run the same load goes to it directly, through nginx (Debian's package, one
worker process, keep-alive upstream, no buffering), through SMG (`smg launch ... --policy
round_robin`, from PyPI; `--smg` names its binary) and through `specgate serve` (threshold policy)
with 1 and with N workers:

- non-streamed: wrk at C=1 and C=64 (latency p50/p99 and req/s); added = target minus direct;
- streamed: 256 concurrent streams of 64 chunks from an aiohttp client in this process; chunk lag
  is arrival minus the sender's CLOCK_MONOTONIC stamp (comparable across processes);
- CPU: the proxy's processes (with their children) CPU time during each load, per request or per
  relayed chunk, from the scheduler's nanosecond count where the kernel keeps it (`_process_cpu`);
- workers: with both specgate gateways running, `--pairs` pairs of the stream load alternate between
  them (one worker, N, N, one, ...) for the N-worker bar's chunks per core-second (`paired_scaling`).

Everything shares the machine's cores, so compare within one run, as ratios; `--rounds N` runs
every target N times, round by round, and reports each number's median (the bars of issue 13 are
judged on those) and every round's own.

    python benchmarks/gateway_overhead.py --out docs/benchmarks/gateway-overhead.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import psutil
import uvloop

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready_blocking
from backends.testbed import start_gateway
from benchmarks.output import interpreter, publish

NGINX, SMG = "nginx (C, 1 worker process)", "SMG (Rust, round_robin)"
BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
STREAMS, CHUNKS = 256, 64
_WRK_LUA = 'wrk.method = "POST"\nwrk.body = \'{body}\'\nwrk.headers["Content-Type"] = "application/json"\n'
_NGINX = """worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  upstream src {{ server 127.0.0.1:{src}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port} backlog=2048;
    location / {{
      proxy_pass http://src;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


@dataclass
class Measured:
    """One target's numbers."""

    name: str
    lat: dict[int, tuple[float, float]] = field(default_factory=dict)  # concurrency -> (p50, p99) seconds
    rps: float = 0.0  # at C=64
    cpu_per_request: float | None = None
    cpu_per_chunk: float | None = None
    chunks_per_cpu_second: float | None = None
    lag_p99: float = 0.0
    errors: int = 0
    # N workers only: chunks/s per core of CPU against one worker's, over stream loads alternating between the two.
    paired_scaling: float | None = None


def _wait_http(base: str, timeout: float) -> None:
    """Until `base`/v1/models answers 200 (nginx passes it to the upstream; SMG serves it itself)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base} not ready after {timeout:g} s")
        time.sleep(0.2)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _cpu(pids: list[int]) -> float:
    """CPU seconds of these processes and all their descendants (live ones)."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            total += _process_cpu(proc)
    return total


def _process_cpu(proc: psutil.Process) -> float:
    """The scheduler's nanosecond count of CPU time, summed over the process's threads, where the
    kernel keeps it (/proc/PID/task/TID/schedstat); else user+system in clock ticks. A tick is 10 ms:
    about 2.5% of a round's stream CPU, too coarse for the bars. A thread that exited is not counted
    by schedstat: none of the proxies here start and end threads while relaying."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return float(times.user + times.system)


def _cpu_clock() -> str:
    """Which CPU clock `_process_cpu` reads on this machine."""
    kept = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")
    return "the scheduler's nanosecond count, schedstat" if kept else "user+system in clock ticks"


def _seconds(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def _wrk(url: str, connections: int, seconds: float, script: Path) -> tuple[float, float, float, int, int]:
    """(p50, p99, req/s, requests, errors) of wrk POSTing to `url`."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), url],
        check=True, capture_output=True, text=True,
    ).stdout
    p50 = _seconds(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _seconds(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = int(bad.group(1)) if bad else 0
    errors += sum(int(g) for g in socket_errors.groups()) if socket_errors else 0
    return p50, p99, rps, requests, errors


async def _streams(url: str, streams: int = STREAMS) -> tuple[list[float], int]:
    """Chunk lags of `streams` concurrent streams of CHUNKS chunks, and the chunks relayed."""
    body = orjson.dumps({**BODY, "max_tokens": CHUNKS, "stream": True})
    lags: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                assert resp.status == 200, resp.status
                while event := await resp.content.readuntil(b"\n\n"):
                    payload = event[5:].strip()
                    if payload != b"[DONE]":
                        lags.append(time.monotonic() - orjson.loads(payload)["ts"])

        await asyncio.gather(*(one() for _ in range(streams)))
    return lags, len(lags)


def measure(name: str, base: str, pids: list[int], seconds: float, script: Path) -> Measured:
    """Non-streamed latency at C=1 and C=64, then the streams, against one target."""
    url = base + "/v1/chat/completions"
    m = Measured(name)
    _wrk(url, 8, 1.0, script)  # warm: connections, pools, caches
    p50, p99, _, _, errors = _wrk(url, 1, seconds, script)
    m.lat[1] = (p50, p99)
    before = _cpu(pids)
    p50, p99, m.rps, requests, more = _wrk(url, 64, seconds, script)
    m.lat[64] = (p50, p99)
    m.errors = errors + more
    if pids:
        m.cpu_per_request = (_cpu(pids) - before) / max(requests, 1)
    before = _cpu(pids)
    lags, chunks = uvloop.run(_streams(url))
    if pids:
        spent = _cpu(pids) - before
        m.cpu_per_chunk = spent / chunks
        m.chunks_per_cpu_second = chunks / spent if spent > 0 else None
    m.lag_p99 = _pct(lags, 0.99)
    return m


def paired_scaling(one: list[int], many: list[int], url_one: str, url_many: str, pairs: int) -> float:
    """Chunks/s per core of gateway CPU of `many` (pids) over `one`'s, from `pairs` pairs of the stream load
    alternating between the two running gateways (one, many, many, one, ...): both see the same moments of a
    drifting machine, which the rounds' back-to-back measurements do not."""
    chunks = {id(one): 0, id(many): 0}
    spent = {id(one): 0.0, id(many): 0.0}
    for i in range(pairs):
        order = [(one, url_one), (many, url_many)]
        for pids, url in order if i % 2 == 0 else order[::-1]:
            before = _cpu(pids)
            _, relayed = uvloop.run(_streams(url + "/v1/chat/completions"))
            spent[id(pids)] += _cpu(pids) - before
            chunks[id(pids)] += relayed
    return (chunks[id(many)] / spent[id(many)]) / (chunks[id(one)] / spent[id(one)])


def _specgate_config(tmp: Path, src: str, workers: int) -> Path:
    config = tmp / f"specgate-{workers}.toml"
    backends = "".join(
        f'[[backends]]\nname = "{n}"\nurl = "{src}"\nspeculative = {s}\n' for n, s in (("eagle", "true"), ("plain", "false"))
    )
    config.write_text(f'[server]\nlog_level = "warning"\nworkers = {workers}\n[policy]\nname = "threshold"\n{backends}')
    return config


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.0f}"


def _median(runs: list[Measured]) -> Measured:
    """One target's rounds as one: the median of each number."""

    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    lat = {c: (statistics.median(r.lat[c][0] for r in runs), statistics.median(r.lat[c][1] for r in runs)) for c in runs[0].lat}
    return Measured(
        runs[0].name,
        lat,
        statistics.median(r.rps for r in runs),
        med([r.cpu_per_request for r in runs]),
        med([r.cpu_per_chunk for r in runs]),
        med([r.chunks_per_cpu_second for r in runs]),
        statistics.median(r.lag_p99 for r in runs),
        sum(r.errors for r in runs),
    )


def bars(results: list[Measured]) -> list[str]:
    """Issue 13's bars, each specgate row against SMG's and nginx's (medians)."""
    by_name = {m.name: m for m in results}
    smg, nginx, direct = by_name[SMG], by_name[NGINX], results[0]
    out = []
    for m in results:
        if not m.name.startswith("specgate"):
            continue
        checks = [
            ("CPU per request (µs)", m.cpu_per_request or 0.0, smg.cpu_per_request or 0.0, "<=", _us),
            ("CPU per chunk (µs)", m.cpu_per_chunk or 0.0, smg.cpu_per_chunk or 0.0, "<=", _us),
            ("req/s at C=64", m.rps, smg.rps, ">=", lambda v: f"{v:,.0f}"),
            ("added p50 at C=1 (ms)", m.lat[1][0] - direct.lat[1][0], smg.lat[1][0] - direct.lat[1][0], "<=", _ms),
            ("chunk lag p99 (ms) against nginx's + 2 ms", m.lag_p99, nginx.lag_p99 + 0.002, "<=", _ms),
        ]
        cells = []
        for label, mine, bar, op, fmt in checks:
            met = mine <= bar if op == "<=" else mine >= bar
            cells.append(f"{label} {fmt(mine)} {op} {fmt(bar)}: {'met' if met else 'not met'}")
        out.append(f"- {m.name}: " + "; ".join(cells))
    return out


def scaling(rounds: list[list[Measured]]) -> list[str]:
    """The N-worker bar: specgate's chunks/s per core of its CPU with N workers against 1 worker's.

    Judged on the stream loads alternating between the two gateways within each round (`paired_scaling`),
    median over the rounds; each round's ratio of its two back-to-back measurements is shown too (a
    dozen seconds apart, on a machine that drifts by more than the bar's 10% in that time).
    """
    names = [m.name for m in rounds[0] if m.name.startswith("specgate")]
    if len(names) < 2:
        return []
    many = names[-1]
    at = [m.name for m in rounds[0]].index
    pairs = [(r[at(names[0])].chunks_per_cpu_second, r[at(many)].chunks_per_cpu_second) for r in rounds]
    ratios = [n / o for o, n in pairs if o and n]
    alternating = [s for r in rounds if (s := r[at(many)].paired_scaling) is not None]
    if not ratios:
        return []
    back_to_back = statistics.median(ratios)
    judged, how = (statistics.median(alternating), "alternating stream loads") if alternating else (back_to_back, "back to back")
    shown = f"; alternating, each round: {', '.join(f'{r:.2f}' for r in alternating)}" if alternating else ""
    return [
        f"- {many} against {names[0]}: chunks/s per core of gateway CPU {judged:.3f}x ({how}, median over the rounds"
        f"{shown}; back to back, each round: {', '.join(f'{r:.2f}' for r in ratios)}, median {back_to_back:.3f}x) "
        f">= 0.90x: {'met' if judged >= 0.9 else 'not met'}"
    ]


def report(rounds: list[list[Measured]], args: argparse.Namespace, cores: int) -> str:
    """Medians over the rounds, the issue's bars on them, then every round's own numbers."""
    results = [_median([r[i] for r in rounds]) for i in range(len(rounds[0]))]
    direct = results[0]
    many = len(rounds) > 1
    lines = [
        "# Gateway overhead: specgate beside nginx and SMG, against the same upstream, in one run",
        "",
        f"Command: `python benchmarks/{Path(__file__).name} --seconds {args.seconds:g} --step {args.step:g}"
        + (f" --rounds {len(rounds)}`" if many else "`"),
        "",
        f"Python (specgate, the upstream and the streaming client): {interpreter()}.",
        "",
        f"Upstream: benchmarks/sse_source.py (aiohttp, one process) answering non-streamed requests at once and "
        f"streaming a chunk every {args.step * 1e3:g} ms to all open streams in lockstep. Non-streamed: wrk, "
        f"{args.seconds:g} s at C=1 and at C=64. Streamed: {STREAMS} concurrent streams of {CHUNKS} chunks from an "
        "aiohttp client; chunk lag = arrival minus the sender's monotonic stamp. CPU: the proxy's processes "
        f"(children included; {_cpu_clock()}) per request at C=64 and per relayed chunk. {cores} cores shared by the upstream, "
        "the proxy, the clients and whatever else runs on the machine: compare within the run."
        + (f" Every target ran once per round, {len(rounds)} rounds; the table holds each number's median." if many else ""),
        "",
        "| target | added p50 C=1 (ms) | added p99 C=1 (ms) | added p50 C=64 (ms) | added p99 C=64 (ms) | req/s C=64 "
        "| CPU per request (µs) | CPU per chunk (µs) | chunks/s per core of proxy CPU | chunk lag p99, 256 streams (ms) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        added = [m.lat[c][i] - direct.lat[c][i] for c in (1, 64) for i in (0, 1)]
        cells = ["-"] * 4 if m is direct else [f"{a * 1e3:+.2f}" for a in added]
        per_core = "-" if m.chunks_per_cpu_second is None else f"{m.chunks_per_cpu_second:,.0f}"
        lines.append(
            f"| {m.name} | {' | '.join(cells)} | {m.rps:,.0f} | {_us(m.cpu_per_request)} | {_us(m.cpu_per_chunk)} "
            f"| {per_core} | {_ms(m.lag_p99)} | {m.errors} |"
        )
    lines += ["", "Bars (issue 13), on the medians:", "", *bars(results), *scaling(rounds)]
    if many:
        lines += ["", "Each round: CPU per request (µs) / CPU per chunk (µs) / req/s C=64 / chunk lag p99 (ms).", ""]
        lines += ["| target | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " |"]
        lines += ["|---|" + "---|" * len(rounds)]
        for i, m in enumerate(results[1:], start=1):
            cells = [
                f"{_us(r[i].cpu_per_request)} / {_us(r[i].cpu_per_chunk)} / {r[i].rps:,.0f} / {_ms(r[i].lag_p99)}" for r in rounds
            ]
            lines.append(f"| {m.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _peer(name: str, argv: list[str], port: int, ready_timeout: float, script: Path, seconds: float) -> Measured:
    """Start a peer proxy listening on `port`, measure it once it answers, stop it."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}", ready_timeout)
        return measure(name, f"http://127.0.0.1:{port}", [proc.pid], seconds, script)
    finally:
        proc.terminate()
        proc.wait(10)


def one_round(tmp: Path, src_port: int, script: Path, args: argparse.Namespace) -> list[Measured]:
    """Every target once, one after another, against the running upstream on `src_port`."""
    src = f"http://127.0.0.1:{src_port}"
    results = [measure("direct (no proxy)", src, [], args.seconds, script)]
    nginx_port = free_loopback_port()
    (tmp / "nginx.conf").write_text(_NGINX.format(tmp=tmp, src=src_port, port=nginx_port))
    nginx = ["nginx", "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"]
    results.append(_peer(NGINX, nginx, nginx_port, 30, script, args.seconds))
    smg_port = free_loopback_port()
    smg = [args.smg, "launch", "--worker-urls", src, "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(smg_port),
           "--log-level", "error", "--disable-tokenizer-autoload", "--prometheus-port", str(free_loopback_port())]
    results.append(_peer(SMG, smg, smg_port, 60, script, args.seconds))
    gateways = {}
    try:
        for workers in sorted({1, args.workers}):
            gateways[workers] = start_gateway(config=_specgate_config(tmp, src, workers))
        for workers, gateway in gateways.items():
            name = f"specgate, {workers} worker{'s' if workers > 1 else ''} (threshold)"
            results.append(measure(name, gateway.url, [gateway.proc.pid], args.seconds, script))
        if len(gateways) > 1 and args.pairs:
            one, many = gateways[1], gateways[args.workers]
            results[-1].paired_scaling = paired_scaling([one.proc.pid], [many.proc.pid], one.url, many.url, args.pairs)
    finally:
        for gateway in gateways.values():
            gateway.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", type=float, default=0.02, help="source: seconds between chunks of every stream")
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run")
    parser.add_argument("--smg", default=shutil.which("smg") or "/tmp/smgvenv/bin/smg", help="SMG's binary")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="specgate's N workers")
    parser.add_argument("--rounds", type=int, default=1, help="every target this many times, round by round; medians reported")
    parser.add_argument("--pairs", type=int, default=2, help="per round, pairs of alternating stream loads for the workers' ratio")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    src_port = free_loopback_port()
    src = f"http://127.0.0.1:{src_port}"
    rounds: list[list[Measured]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "post.lua"
        script.write_text(_WRK_LUA.format(body=orjson.dumps(BODY).decode()))
        source = Child("sse-source", [sys.executable, str(Path(__file__).with_name("sse_source.py")), "--port", str(src_port),
                                      "--step", str(args.step), "--lockstep", "--instant"], log_path=tmp / "source.log")
        source.start()
        try:
            wait_until_ready_blocking(src, source, 30)
            for _ in range(args.rounds):
                rounds.append(one_round(tmp, src_port, script, args))
        finally:
            source.stop_blocking(grace=10)
    publish(report(rounds, args, cores), args.out)


if __name__ == "__main__":
    main()
