"""Benchmark: latency the gateway adds over calling the backend directly.

One stamping SSE source (benchmarks/sse_source.py) serves as both backends; the same load is sent
to it directly and through `specgate serve`, in alternating rounds within one run. Non-streaming:
request transit p50/p99 (stamped, see `_non_stream`), gateway minus direct. Streaming: per-chunk delivery latency (arrival minus
the sender's CLOCK_MONOTONIC stamp, comparable across processes), gateway minus direct. Source,
gateway and this client are three processes sharing the machine's 2 cores.

    python benchmarks/gateway_overhead.py --out docs/benchmarks/gateway-overhead.md
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import psutil
import uvloop

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready_blocking
from backends.testbed import GatewayProcess, start_gateway
from benchmarks.output import publish


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def _non_stream(session: aiohttp.ClientSession, url: str, concurrency: int, requests: int) -> list[float]:
    """Transit time of each request: client to source plus response to client, both stamped with
    the shared monotonic clock, so the source's modelled wait for its tokens (and its timer jitter,
    which is larger than the gateway's hop) is not part of it."""
    latencies: list[float] = []
    remaining = requests
    # 5..15 tokens: real completions end at different times; identical ones would all finish in
    # the same instant and arrive back as one burst of `concurrency` requests, every round.
    lengths = random.Random(requests)

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            body = orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "x"}],
                                 "max_tokens": lengths.randint(5, 15), "client_ts": time.monotonic()})
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                raw = await resp.read()
                assert resp.status == 200, resp.status
            answer = orjson.loads(raw)
            latencies.append(answer["inbound"] + time.monotonic() - answer["ts"])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def _stream(session: aiohttp.ClientSession, url: str, concurrency: int, chunks: int) -> list[float]:
    body = orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": chunks, "stream": True})
    delays: list[float] = []

    async def one() -> None:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            assert resp.status == 200, resp.status
            while event := await resp.content.readuntil(b"\n\n"):
                payload = event[5:].strip()
                if payload != b"[DONE]":
                    delays.append(time.monotonic() - orjson.loads(payload)["ts"])

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return delays


async def bench(
    direct: str, gateway: str, rounds: int, gateway_process: psutil.Process
) -> list[tuple[str, int, dict[str, list[float]], float]]:
    """Per scenario: the samples of both paths and the gateway's CPU seconds per sample."""
    scenarios = [("non-streaming request", 1, 100), ("non-streaming request", 256, 1536), ("streamed chunk", 1, 200), ("streamed chunk", 256, 40)]
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
        for kind, conc, size in scenarios:
            samples: dict[str, list[float]] = {"direct": [], "gateway": []}
            cpu = 0.0
            for _ in range(rounds):
                for name, base in (("direct", direct), ("gateway", gateway)):
                    url = base + "/v1/chat/completions"
                    before = gateway_process.cpu_times()
                    if kind.startswith("non"):
                        samples[name] += await _non_stream(session, url, conc, size)
                    else:
                        samples[name] += await _stream(session, url, conc, size)
                    if name == "gateway":
                        after = gateway_process.cpu_times()
                        cpu += after.user + after.system - before.user - before.system
            out.append((kind, conc, samples, cpu / len(samples["gateway"])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", type=float, default=0.05, help="source: seconds between chunks of one stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    src_port = free_loopback_port()
    src_url = f"http://127.0.0.1:{src_port}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gw.toml"
        backends = "".join(
            f'[[backends]]\nname = "{n}"\nurl = "{src_url}"\nspeculative = {s}\n' for n, s in (("eagle", "true"), ("plain", "false"))
        )
        config.write_text(f"[server]\nlog_level = \"warning\"\n{backends}")
        source = Child("sse-source", [sys.executable, str(Path(__file__).with_name("sse_source.py")), "--port", str(src_port),
                                      "--step", str(args.step)], log_path=Path(tmp) / "source.log")
        gateway: GatewayProcess | None = None
        source.start()
        try:
            wait_until_ready_blocking(src_url, source, 30)
            gateway = start_gateway(config=config)
            results = uvloop.run(bench(src_url, gateway.url, args.rounds, psutil.Process(gateway.proc.pid)))
        finally:
            if gateway is not None:
                gateway.stop()
            source.stop_blocking(grace=10)
    lines = [
        "# Gateway overhead: added latency versus calling the backend directly",
        "",
        f"Command: `python benchmarks/{Path(__file__).name} --step {args.step} --rounds {args.rounds}`",
        "",
        "Source: benchmarks/sse_source.py (chunks every "
        f"{args.step * 1e3:g} ms per stream, stamped with the sender's monotonic clock); gateway: `specgate serve` "
        "with both backends pointing at the source; client: aiohttp in a third process. Direct and gateway rounds "
        f"alternate ({args.rounds} rounds each). Added = gateway minus direct at the same percentile.",
        "",
        "Non-streaming latency is the request's transit (client to source, plus the response back), "
        "stamped with the shared monotonic clock, so the source's wait for its 5-15 tokens is not in it. "
        "Gateway CPU is the gateway process's user+system time during its rounds, per sample (per request, or "
        "per chunk for streams, including the request's own share).",
        "",
        "| measured | concurrency | direct p50 (ms) | gateway p50 (ms) | added p50 (ms) | direct p99 (ms) | gateway p99 (ms) | added p99 (ms) | gateway CPU per sample (µs) | samples |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, conc, s, cpu in results:
        d50, g50 = _pct(s["direct"], 0.5) * 1e3, _pct(s["gateway"], 0.5) * 1e3
        d99, g99 = _pct(s["direct"], 0.99) * 1e3, _pct(s["gateway"], 0.99) * 1e3
        lines.append(
            f"| {kind} | {conc} | {d50:.2f} | {g50:.2f} | {g50 - d50:.2f} | {d99:.2f} | {g99:.2f} | {g99 - d99:.2f} "
            f"| {cpu * 1e6:.0f} | {len(s['gateway'])} |"
        )
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
