"""Where N workers' extra CPU per chunk comes from: the shared state, or splitting the load over processes.

`benchmarks/gateway_overhead.py` holds N workers' chunks per core-second of gateway CPU against one
worker's. Part of any difference is not the workers' shared state (the load board, the routing lock,
the multiprocess metrics) at all: N processes that each relay 1/N of the streams wake more often per
chunk and read smaller batches per wake than one process relaying them all, on cores they share with
the upstream and the clients. This separates the two. Three setups run side by side against one
upstream (benchmarks/sse_source.py --lockstep --instant), and each round sends gateway_overhead's
stream load (256 streams of 64 chunks) to each in turn (the order rotates):

- one: a 1-worker `specgate serve` relaying all 256 streams;
- N workers: an N-worker `specgate serve` relaying all 256 (the processes share the listening socket);
- N processes: N separate 1-worker gateways relaying 256/N streams each, at the same time: the same
  split over processes with no state shared between them.

Reported per round and as medians: each setup's gateway CPU per relayed chunk (the scheduler's
nanosecond count, every process of the setup), voluntary context switches per chunk (how often its
processes went to sleep waiting for I/O), and the ratios of chunks per core-second: N workers over one
(gateway_overhead's bar), N processes over one (the split alone) and N workers over N processes (the
shared state alone).

    python benchmarks/worker_split.py --rounds 12 [--workers 2] [--out docs/benchmarks/worker-split.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import uvloop

from backends.testbed import GatewayProcess, start_gateway
from benchmarks.gateway_ab import start_source
from benchmarks.gateway_overhead import CHUNKS, STREAMS, _process_cpu, _specgate_config, _streams
from benchmarks.output import interpreter, publish


@dataclass
class Setup:
    """Gateways that share one stream load between them, and every process they run."""

    name: str
    gateways: list[GatewayProcess]

    def processes(self) -> list[psutil.Process]:
        out = []
        for gateway in self.gateways:
            root = psutil.Process(gateway.proc.pid)
            out += [root, *root.children(recursive=True)]
        return out


def _spent(procs: list[psutil.Process]) -> tuple[float, int]:
    """CPU seconds and voluntary context switches of these processes so far."""
    return sum(_process_cpu(p) for p in procs), sum(p.num_ctx_switches().voluntary for p in procs)


async def _load(setup: Setup) -> int:
    """STREAMS streams split evenly over the setup's gateways, all at once; the chunks relayed."""
    share = STREAMS // len(setup.gateways)
    done = await asyncio.gather(*(_streams(g.url + "/v1/chat/completions", share) for g in setup.gateways))
    return sum(chunks for _, chunks in done)


def measure(setup: Setup) -> tuple[float, float]:
    """(CPU µs per chunk, voluntary context switches per chunk) of one stream load."""
    procs = setup.processes()
    cpu0, switches0 = _spent(procs)
    chunks = uvloop.run(_load(setup))
    cpu1, switches1 = _spent(procs)
    return (cpu1 - cpu0) / chunks * 1e6, (switches1 - switches0) / chunks


def report(runs: dict[str, list[tuple[float, float]]], workers: int, rounds: int) -> str:
    one, many, split = f"one (1 worker, {STREAMS} streams)", f"{workers} workers", f"{workers} processes"
    names = list(runs)
    lines = [
        "# N workers against the same load split over N separate processes",
        "",
        f"Command: `python benchmarks/worker_split.py --rounds {rounds} --workers {workers}`",
        "",
        f"Python: {interpreter()}. {len(os.sched_getaffinity(0))} cores shared by the upstream, the gateways and the client.",
        f"Each round: {STREAMS} streams of {CHUNKS} chunks to each setup in turn (the order rotates); "
        f"`{split}` is {workers} separate 1-worker gateways taking {STREAMS // workers} streams each at once.",
        "",
        "| round | " + " | ".join(f"{n}: CPU per chunk (µs) / voluntary switches per chunk" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for i in range(rounds):
        lines.append(f"| {i + 1} | " + " | ".join(f"{runs[n][i][0]:.1f} / {runs[n][i][1]:.3f}" for n in names) + " |")
    lines.append(
        "| **median** | "
        + " | ".join(f"{statistics.median(r[0] for r in runs[n]):.1f} / {statistics.median(r[1] for r in runs[n]):.3f}" for n in names)
        + " |"
    )

    def ratio(a: str, b: str) -> str:
        per_round = [runs[b][i][0] / runs[a][i][0] for i in range(rounds)]  # chunks per core-second of a over b's
        return f"{statistics.median(per_round):.3f}x (each round: {', '.join(f'{r:.2f}' for r in per_round)})"

    lines += [
        "",
        "Chunks per core-second of gateway CPU, median of the rounds' own ratios:",
        "",
        f"- {many} over {one}: {ratio(many, one)}",
        f"- {split} over {one} (splitting the load, nothing shared): {ratio(split, one)}",
        f"- {many} over {split} (the workers' shared state): {ratio(many, split)}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="N")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.workers < 2 or STREAMS % args.workers:
        parser.error(f"--workers must be at least 2 and divide {STREAMS}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        source, src = start_source(tmp)
        started: list[GatewayProcess] = []
        try:
            config = _specgate_config(tmp, src, 1)
            setups = [Setup(f"one (1 worker, {STREAMS} streams)", [start_gateway(config=config)])]
            started += setups[0].gateways
            setups.append(Setup(f"{args.workers} workers", [start_gateway(config=_specgate_config(tmp, src, args.workers))]))
            started += setups[1].gateways
            setups.append(Setup(f"{args.workers} processes", [start_gateway(config=config) for _ in range(args.workers)]))
            started += setups[2].gateways
            for setup in setups:  # warm: connections, pools, caches
                measure(setup)
            runs: dict[str, list[tuple[float, float]]] = {s.name: [] for s in setups}
            for i in range(args.rounds):
                for setup in setups[i % 3 :] + setups[: i % 3]:
                    runs[setup.name].append(measure(setup))
        finally:
            for gateway in started:
                gateway.stop()
            source.stop_blocking(grace=10)
    publish(report(runs, args.workers, args.rounds), args.out)


if __name__ == "__main__":
    main()
