"""Benchmark: aiohttp vs httpx as the gateway's upstream client for relaying SSE streams.

Both clients read the same 256 concurrent streams from a stamping source in another process
(benchmarks/sse_source.py) and do the same per-event work (split on the blank line, decode the
JSON). Measured per client, in alternating rounds within one run: client CPU time per chunk (the
gateway's cost), and delivery latency per chunk (arrival minus the sender's CLOCK_MONOTONIC stamp).

    python benchmarks/upstream_clients.py --streams 256 --chunks 64 --step 0.05 --rounds 3 \
        --out docs/benchmarks/upstream-clients.md
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import orjson
import uvloop

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready_blocking
from benchmarks.output import publish

Reader = Callable[[int, list[float]], Awaitable[int]]


def _consume(buffer: bytes, latencies: list[float]) -> tuple[bytes, int]:
    events = 0
    while (end := buffer.find(b"\n\n")) >= 0:
        event, buffer = buffer[:end], buffer[end + 2 :]
        payload = event[5:].strip()
        if payload != b"[DONE]":
            latencies.append(time.monotonic() - orjson.loads(payload)["ts"])
            events += 1
    return buffer, events


def _body(chunks: int, i: int) -> bytes:
    return orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": chunks, "stream": True, "rid": f"r{i}"})


async def run_aiohttp_iter_any(url: str, streams: int, chunks: int, latencies: list[float]) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:
        async def one(i: int) -> int:
            async with session.post(url, data=_body(chunks, i), headers={"content-type": "application/json"}) as resp:
                buffer, total = b"", 0
                async for data in resp.content.iter_any():
                    buffer, n = _consume(buffer + data, latencies)
                    total += n
                return total
        return sum(await asyncio.gather(*(one(i) for i in range(streams))))


async def run_aiohttp_readuntil(url: str, streams: int, chunks: int, latencies: list[float]) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:
        async def one(i: int) -> int:
            async with session.post(url, data=_body(chunks, i), headers={"content-type": "application/json"}) as resp:
                total = 0
                while event := await resp.content.readuntil(b"\n\n"):
                    _, n = _consume(event, latencies)
                    total += n
                return total
        return sum(await asyncio.gather(*(one(i) for i in range(streams))))


async def run_httpx(url: str, streams: int, chunks: int, latencies: list[float]) -> int:
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:
        async def one(i: int) -> int:
            async with client.stream("POST", url, content=_body(chunks, i), headers={"content-type": "application/json"}) as resp:
                buffer, total = b"", 0
                async for data in resp.aiter_raw():
                    buffer, n = _consume(buffer + data, latencies)
                    total += n
                return total
        return sum(await asyncio.gather(*(one(i) for i in range(streams))))


CLIENTS = {
    "aiohttp (readuntil, as the relay uses)": run_aiohttp_readuntil,
    "aiohttp (iter_any)": run_aiohttp_iter_any,
    "httpx (aiter_raw)": run_httpx,
}


async def bench(url: str, streams: int, chunks: int, rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, dict[str, list[float]]] = {name: {"cpu_us": [], "lat": [], "wall": []} for name in CLIENTS}
    for _ in range(rounds):
        for name, fn in CLIENTS.items():  # alternate clients so machine drift hits all equally
            latencies: list[float] = []
            cpu0, wall0 = time.process_time(), time.perf_counter()
            events = await fn(url, streams, chunks, latencies)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            if events != streams * (chunks + 1):
                raise RuntimeError(f"{name}: got {events} events, expected {streams * (chunks + 1)}")
            samples[name]["cpu_us"].append(cpu / events * 1e6)
            samples[name]["wall"].append(wall)
            samples[name]["lat"].extend(latencies)
    out = {}
    for name, s in samples.items():
        lat = sorted(s["lat"])
        out[name] = {
            "cpu_us_per_chunk": statistics.median(s["cpu_us"]),
            "latency_p50_ms": lat[len(lat) // 2] * 1e3,
            "latency_p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
            "round_wall_s": statistics.median(s["wall"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--step", type=float, default=0.05, help="seconds between chunks of one stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    port = free_loopback_port()
    with tempfile.TemporaryDirectory() as tmp:
        source = Child("sse-source", [sys.executable, str(Path(__file__).with_name("sse_source.py")), "--port", str(port),
                                      "--step", str(args.step)], log_path=Path(tmp) / "source.log")
        source.start()
        try:
            wait_until_ready_blocking(f"http://127.0.0.1:{port}", source, 30)
            results = uvloop.run(bench(f"http://127.0.0.1:{port}/v1/chat/completions", args.streams, args.chunks, args.rounds))
        finally:
            source.stop_blocking(grace=10)
    rate = args.streams / args.step
    lines = [
        "# Upstream client for the streaming relay: aiohttp vs httpx",
        "",
        f"Command: `python benchmarks/{Path(__file__).name} --streams {args.streams} --chunks {args.chunks} --step {args.step} --rounds {args.rounds}`",
        "",
        f"{args.streams} concurrent SSE streams of {args.chunks} chunks, one chunk per stream every {args.step * 1e3:g} ms "
        f"(~{rate:.0f} chunks/s offered), source in a separate process on the same 2-core machine; "
        f"{args.rounds} alternating rounds per client; CPU is the client process's CPU time per chunk (median of rounds), "
        "latency is arrival minus the sender's monotonic stamp over all chunks.",
        "",
        "| client | CPU per chunk (us) | delivery p50 (ms) | delivery p99 (ms) | round wall (s) |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['cpu_us_per_chunk']:.1f} | {r['latency_p50_ms']:.2f} | {r['latency_p99_ms']:.2f} | {r['round_wall_s']:.2f} |")
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
