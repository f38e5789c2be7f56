"""Before and after, on the stream load only: two checkouts' gateways running at once, loads alternating.

`benchmarks/gateway_ab.py` starts each checkout's gateway in turn and measures everything once per
round, a dozen seconds apart; the 256-stream chunk lag p99 moves by more than a change to the hot
path between such moments. Here both gateways (`specgate serve`, threshold policy, each from its
own tree and `.venv`) run side by side against one upstream (benchmarks/sse_source.py --lockstep
--instant) and each round sends `benchmarks/gateway_overhead.py`'s stream load (256 streams of 64
chunks) to one, then the other (the order swaps every round). Reported per round and as medians:
chunk lag p99 and the gateway's CPU per relayed chunk, and in how many rounds `after` was lower.

    python benchmarks/stream_ab.py --before <checkout> --after <checkout> --rounds 16
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready_blocking
from benchmarks.gateway_ab import _interpreter
from benchmarks.gateway_overhead import _cpu, _pct, _specgate_config, _streams
from benchmarks.output import publish

_SERVING = re.compile(r"serving on (http://\S+)")


def _start(tree: Path, config: Path, log: Path) -> tuple[Child, str]:
    """`tree`'s gateway, once it serves; its URL."""
    gateway = Child(
        "gateway", [str(tree / ".venv/bin/python"), "-m", "gateway", "serve", "--port", "0", "--config", str(config)],
        env={"PYTHONUNBUFFERED": "1"}, log_path=log, cwd=tree,
    )
    gateway.start()
    deadline = time.monotonic() + 90
    while not (found := _SERVING.search(log.read_text() if log.exists() else "")):
        if time.monotonic() > deadline or not gateway.running:
            gateway.stop_blocking(grace=10)
            raise RuntimeError(f"{tree}: the gateway did not start:\n{gateway.last_lines()}")
        time.sleep(0.1)
    return gateway, found.group(1)


def _load(gateway: Child, url: str) -> tuple[float, float]:
    """(chunk lag p99 in ms, CPU per relayed chunk in µs) of one stream load."""
    before = _cpu([gateway.pid])
    lags, chunks = uvloop.run(_streams(url + "/v1/chat/completions"))
    return _pct(lags, 0.99) * 1e3, (_cpu([gateway.pid]) - before) / chunks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before (with its .venv)")
    parser.add_argument("--after", type=Path, default=Path("."), help="checkout of the code after (with its .venv)")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1, help="the gateways' `[server] workers`")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        port = free_loopback_port()
        src = f"http://127.0.0.1:{port}"
        source = Child(
            "sse-source",
            [sys.executable, str(Path(__file__).with_name("sse_source.py")), "--port", str(port), "--step", "0.02", "--lockstep", "--instant"],
            log_path=tmp / "source.log",
        )
        source.start()
        gateways: dict[str, tuple[Child, str]] = {}
        try:
            wait_until_ready_blocking(src, source, 30)
            config = _specgate_config(tmp, src, args.workers)
            for label, tree in trees.items():
                gateways[label] = _start(tree, config, tmp / f"{label}.log")
            for label in trees:  # warm: connections, pools, caches
                _load(*gateways[label])
            for round_ in range(args.rounds):
                for label in list(trees)[:: 1 if round_ % 2 == 0 else -1]:
                    runs[label].append(_load(*gateways[label]))
                print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1][0]:.1f} ms {v[-1][1]:.1f} µs" for k, v in runs.items()),
                      file=sys.stderr, flush=True)
        finally:
            for gateway, _ in gateways.values():
                gateway.stop_blocking(grace=10)
            source.stop_blocking(grace=10)
    publish(report(trees, runs, args.workers), args.out)


def report(trees: dict[str, Path], runs: dict[str, list[tuple[float, float]]], workers: int) -> str:
    """Every round, the medians, and how often `after` was lower."""
    lines = [f"- {label}: {tree}, {_interpreter(tree)}" for label, tree in trees.items()]
    lines += [
        f"- {len(runs['before'])} rounds, `[server] workers = {workers}`, 256 streams of 64 chunks each load",
        "",
        "| round | before: lag p99 (ms) | after: lag p99 (ms) | before: CPU per chunk (µs) | after: CPU per chunk (µs) |",
        "|---|---|---|---|---|",
    ]
    for i, (b, a) in enumerate(zip(runs["before"], runs["after"]), start=1):
        lines.append(f"| {i} | {b[0]:.1f} | {a[0]:.1f} | {b[1]:.1f} | {a[1]:.1f} |")
    med = {label: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for label, rs in runs.items()}
    lower = [sum(a[k] < b[k] for b, a in zip(runs["before"], runs["after"])) for k in (0, 1)]
    lines.append(f"| **median** | {med['before'][0]:.1f} | {med['after'][0]:.1f} | {med['before'][1]:.1f} | {med['after'][1]:.1f} |")
    lines += ["", f"After lower: lag p99 in {lower[0]} of {len(runs['before'])} rounds, CPU per chunk in {lower[1]}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
