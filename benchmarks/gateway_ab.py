"""Before and after: two checkouts' `specgate serve` (threshold policy), alternating, same upstream.

The machine is shared and noisy, so a change to the hot path is judged against the code before it
in the same conditions: one upstream (benchmarks/sse_source.py --lockstep --instant), then for each
round each checkout's gateway in turn (run from its own tree with its own `.venv`), measured with
`benchmarks/gateway_overhead.py`'s `measure`: CPU per request at C=64, CPU per relayed chunk,
req/s at C=64 and the 256-stream chunk lag p99.

    python benchmarks/gateway_ab.py --before /work/main --after . --rounds 2 [--workers 2]

The same code in two checkouts whose `.venv`s come from two Python builds compares the builds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready_blocking
from benchmarks.gateway_overhead import BODY, _WRK_LUA, Measured, _specgate_config, measure
from benchmarks.output import publish

_SERVING = re.compile(r"serving on (http://\S+)")


def start_tree_gateway(tree: Path, config: Path, log: Path) -> tuple[Child, str]:
    """`specgate serve` from `tree` (its own `.venv`), once it serves; the process and its URL."""
    gateway = Child(
        "gateway",
        [str(tree / ".venv/bin/python"), "-m", "gateway", "serve", "--port", "0", "--config", str(config)],
        env={"PYTHONUNBUFFERED": "1"},
        log_path=log,
        cwd=tree,
    )
    gateway.start()
    deadline = time.monotonic() + 90
    while not (found := _SERVING.search(log.read_text() if log.exists() else "")):
        if time.monotonic() > deadline or not gateway.running:
            gateway.stop_blocking(grace=10)
            raise RuntimeError(f"{tree}: the gateway did not start:\n{gateway.last_lines()}")
        time.sleep(0.1)
    return gateway, found.group(1)


def start_source(tmp: Path) -> tuple[Child, str]:
    """The lockstep upstream (benchmarks/sse_source.py --lockstep --instant, 20 ms steps), once ready; it and its URL."""
    port = free_loopback_port()
    src = f"http://127.0.0.1:{port}"
    source = Child(
        "sse-source",
        [sys.executable, str(Path(__file__).with_name("sse_source.py")), "--port", str(port), "--step", "0.02", "--lockstep", "--instant"],
        log_path=tmp / "source.log",
    )
    source.start()
    try:
        wait_until_ready_blocking(src, source, 30)
    except BaseException:
        source.stop_blocking(grace=10)
        raise
    return source, src


def _measure_tree(label: str, tree: Path, config: Path, log: Path, seconds: float, script: Path) -> Measured:
    gateway, url = start_tree_gateway(tree, config, log)
    try:
        return measure(label, url, [gateway.pid], seconds, script)
    finally:
        gateway.stop_blocking(grace=10)


def _interpreter(tree: Path) -> str:
    """The Python of `tree`'s `.venv`, as `benchmarks.output.interpreter` names it."""
    out = subprocess.run([str(tree / ".venv/bin/python"), str(Path(__file__).with_name("output.py"))],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def _row(name: str, m: Measured) -> str:
    return (f"| {name} | {(m.cpu_per_request or 0) * 1e6:.0f} | {(m.cpu_per_chunk or 0) * 1e6:.1f} "
            f"| {m.rps:,.0f} | {m.lag_p99 * 1e3:.1f} | {m.errors} |")


def _medians(label: str, runs: list[Measured]) -> str:
    def mid(values: list[float | None]) -> float:
        return statistics.median(v or 0.0 for v in values)

    return (f"| **{label}, median** | {mid([m.cpu_per_request for m in runs]) * 1e6:.0f} "
            f"| {mid([m.cpu_per_chunk for m in runs]) * 1e6:.1f} | {mid([m.rps for m in runs]):,.0f} "
            f"| {mid([m.lag_p99 for m in runs]) * 1e3:.1f} | {sum(m.errors for m in runs)} |")


def ab_parser(description: str | None, rounds: int) -> argparse.ArgumentParser:
    """The options every before-and-after benchmark takes: the two checkouts, rounds, workers, --out."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before (with its .venv)")
    parser.add_argument("--after", type=Path, default=Path("."), help="checkout of the code after (with its .venv)")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--workers", type=int, default=1, help="the gateways' `[server] workers`")
    parser.add_argument("--out", type=Path)
    return parser


def main() -> None:
    parser = ab_parser(__doc__, rounds=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    lines = [f"- {label}: {tree}, {_interpreter(tree)}" for label, tree in trees.items()]
    lines += [
        "",
        "| | CPU per request (µs) | CPU per chunk (µs) | req/s C=64 | chunk lag p99, 256 streams (ms) | errors |",
        "|---|---|---|---|---|---|",
    ]
    runs: dict[str, list[Measured]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "post.lua"
        script.write_text(_WRK_LUA.format(body=orjson.dumps(BODY).decode()))
        source, src = start_source(tmp)
        try:
            config = _specgate_config(tmp, src, args.workers)
            for round_ in range(1, args.rounds + 1):
                for label, tree in trees.items():
                    m = _measure_tree(label, tree, config, tmp / f"{label}-{round_}.log", args.seconds, script)
                    runs[label].append(m)
                    lines.append(_row(f"{label}, round {round_}", m))
                    print(lines[-1], file=sys.stderr, flush=True)
        finally:
            source.stop_blocking(grace=10)
    lines += [_medians(label, measured) for label, measured in runs.items()]
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
