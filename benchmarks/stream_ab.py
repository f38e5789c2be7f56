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

import statistics
import sys
import tempfile
from pathlib import Path

import uvloop

from backends.process import Child
from benchmarks.gateway_ab import _interpreter, ab_parser, start_source, start_tree_gateway
from benchmarks.gateway_overhead import _cpu, _pct, _specgate_config, _streams
from benchmarks.output import publish

def _load(gateway: Child, url: str) -> tuple[float, float]:
    """(chunk lag p99 in ms, CPU per relayed chunk in µs) of one stream load."""
    before = _cpu([gateway.pid])
    lags, chunks = uvloop.run(_streams(url + "/v1/chat/completions"))
    return _pct(lags, 0.99) * 1e3, (_cpu([gateway.pid]) - before) / chunks * 1e6


def main() -> None:
    args = ab_parser(__doc__, rounds=16).parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        source, src = start_source(tmp)
        gateways: dict[str, tuple[Child, str]] = {}
        try:
            config = _specgate_config(tmp, src, args.workers)
            for label, tree in trees.items():
                gateways[label] = start_tree_gateway(tree, config, tmp / f"{label}.log")
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
