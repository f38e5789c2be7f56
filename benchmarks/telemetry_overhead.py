"""What tracing and the access log cost: CPU per request and per relayed chunk, off against the code
before them, and on against off.

One upstream (benchmarks/sse_source.py --lockstep --instant), one OTLP/HTTP receiver (in this
process; it decodes and counts what it gets) and one gateway per variant, all started first and kept
running. Each round loads every gateway in turn, in a rotating order: CPU of its processes per
request (wrk at C=64, non-streamed) and per relayed chunk (256 streams of 64 chunks), as
`benchmarks/gateway_overhead.py` measures them, but each load's CPU is read `--settle` seconds after
it ended, so the spans and log lines it queued are sent and written by then and count with it:

- `before`: the checkout before tracing and the access log (`--before`, its own `.venv`);
- `off`: this checkout with `[logging] access_log = "off"` and no `[telemetry] otlp_endpoint`;
- `on`: this checkout with the access log to a file and tracing to the receiver at each
  `--ratio` (one variant per ratio: `on, ratio 0.1`, ...);
- with `--parts`, also `access log only` and `tracing only` (at the first ratio), to tell them apart.

    python benchmarks/telemetry_overhead.py --before /tmp/specgate-before --rounds 8 --ratio 0.1 --ratio 1.0
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import uvloop
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.gateway_ab import _interpreter, ab_parser, start_source, start_tree_gateway
from benchmarks.gateway_overhead import BODY, CHUNKS, _WRK_LUA, Measured, _cpu, _pct, _streams, _wrk
from benchmarks.output import publish


class Receiver:
    """An OTLP/HTTP traces endpoint that decodes and counts the spans it gets."""

    def __init__(self) -> None:
        self.spans = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                receiver.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self._server.shutdown()


def _configs(tmp: Path, src: str, workers: int, receiver: str, ratios: list[float], parts: bool) -> dict[str, tuple[str, Path]]:
    """variant -> (which checkout, its config)."""
    base = f'[server]\nlog_level = "warning"\nworkers = {workers}\n[policy]\nname = "threshold"\n' + "".join(
        f'[[backends]]\nname = "{n}"\nurl = "{src}"\nspeculative = {s}\n' for n, s in (("eagle", "true"), ("plain", "false"))
    )
    texts = {"before": ("before", base), "off": ("after", base + '[logging]\naccess_log = "off"\n')}
    tracing = f'[telemetry]\notlp_endpoint = "{receiver}"\nsample_ratio = {{}}\n'
    if parts:
        texts["access log only"] = ("after", base + f'[logging]\naccess_log = "{tmp / "access-only.log"}"\n')
        texts[f"tracing only, ratio {ratios[0]:g}"] = ("after", base + '[logging]\naccess_log = "off"\n' + tracing.format(ratios[0]))
    for ratio in ratios:
        log = tmp / f"access-{ratio:g}.log"
        texts[f"on, ratio {ratio:g}"] = (
            "after",
            base + f'[logging]\naccess_log = "{log}"\n' + tracing.format(ratio),
        )
    out = {}
    for i, (variant, (tree, text)) in enumerate(texts.items()):
        path = tmp / f"variant-{i}.toml"
        path.write_text(text)
        out[variant] = (tree, path)
    return out


def measure(name: str, base: str, pids: list[int], seconds: float, script: Path, settle: float) -> Measured:
    """One load of a running gateway: CPU per request, then per chunk, each read `settle` s after its load."""
    url, m = base + "/v1/chat/completions", Measured(name)
    time.sleep(settle)  # what the previous load left is done
    before = _cpu(pids)
    _, _, m.rps, requests, m.errors = _wrk(url, 64, seconds, script)
    time.sleep(settle)
    m.cpu_per_request = (_cpu(pids) - before) / max(requests, 1)
    before = _cpu(pids)
    lags, chunks = uvloop.run(_streams(url))
    time.sleep(settle)
    m.cpu_per_chunk = (_cpu(pids) - before) / chunks
    m.lag_p99 = _pct(lags, 0.99)
    return m


def _mid(values: list[float | None]) -> float:
    return statistics.median(v or 0.0 for v in values)


def main() -> None:
    parser = ab_parser(__doc__, rounds=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run")
    parser.add_argument("--ratio", type=float, action="append", help="a tracing sample_ratio to measure (repeatable)")
    parser.add_argument("--parts", action="store_true", help="also measure the access log alone and tracing alone")
    parser.add_argument("--settle", type=float, default=1.5, help="seconds after each load before its CPU is read "
                        "(over the span processor's 1 s schedule and the access log's 0.1 s flush)")
    args = parser.parse_args()
    ratios = args.ratio or [0.1, 1.0]
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[Measured]] = {}
    receiver = Receiver()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "post.lua"
        script.write_text(_WRK_LUA.format(body=orjson.dumps(BODY).decode()))
        source, src = start_source(tmp)
        gateways = {}
        try:
            configs = _configs(tmp, src, args.workers, receiver.url, ratios, args.parts)
            variants = list(configs)
            runs = {v: [] for v in variants}
            for i, (variant, (tree, config)) in enumerate(configs.items()):
                gateways[variant] = start_tree_gateway(trees[tree], config, tmp / f"gateway-{i}.log")
                _wrk(gateways[variant][1] + "/v1/chat/completions", 8, 1.0, script)  # warm: connections, pools, caches
            for round_ in range(args.rounds):
                order = variants[round_ % len(variants):] + variants[: round_ % len(variants)]  # rotate: no variant always first
                for variant in order:
                    gateway, base = gateways[variant]
                    m = measure(variant, base, [gateway.pid], args.seconds, script, args.settle)
                    runs[variant].append(m)
                    print(f"round {round_ + 1}: {variant}: {(m.cpu_per_request or 0) * 1e6:.0f} us/request, "
                          f"{(m.cpu_per_chunk or 0) * 1e6:.1f} us/chunk, {m.rps:,.0f} req/s, {m.errors} errors", file=sys.stderr, flush=True)
        finally:
            for gateway, _ in gateways.values():
                gateway.stop_blocking(grace=10)
            source.stop_blocking(grace=10)
            receiver.close()
    publish(_report(args, trees, runs, receiver.spans), args.out)


def _report(args: Any, trees: dict[str, Path], runs: dict[str, list[Measured]], spans: int) -> str:
    lines = [
        "# Tracing and the access log: what they cost the gateway",
        "",
        f"Command: `python benchmarks/telemetry_overhead.py --before <checkout before> --rounds {args.rounds} --workers {args.workers} "
        f"--seconds {args.seconds:g} " + " ".join(f"--ratio {r:g}" for r in (args.ratio or [0.1, 1.0]))
        + (" --parts" if args.parts else "") + "`",
        "",
        *(f"- {label}: {_interpreter(tree)}" for label, tree in trees.items()),
        f"- spans the receiver decoded, all rounds: {spans:,}",
        "",
        f"Medians over the rounds (wrk at C=64, {args.seconds:g} s, non-streamed, for CPU per request; 256 streams of 64 "
        f"chunks for CPU per chunk; each read {args.settle:g} s after its load):",
        "",
        f"| variant | CPU per request (µs) | CPU per chunk (µs) | CPU per streamed request of {CHUNKS} chunks (µs) "
        "| req/s C=64 | chunk lag p99 (ms) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, measured in runs.items():
        chunk = _mid([m.cpu_per_chunk for m in measured])
        lines.append(
            f"| {variant} | {_mid([m.cpu_per_request for m in measured]) * 1e6:.0f} | {chunk * 1e6:.1f} | {chunk * CHUNKS * 1e6:.0f} "
            f"| {_mid([m.rps for m in measured]):,.0f} | {_mid([m.lag_p99 for m in measured]) * 1e3:.1f} | {sum(m.errors for m in measured)} |"
        )
    lines += ["", "Ratios, per round and their median (each round loads every running gateway in turn, in rotating order):", ""]
    lines += ["| ratio | CPU per request, per round | median | CPU per chunk (and per streamed request), per round | median |",
              "|---|---|---|---|---|"]
    pairs = [("off", "before")] + [(v, "off") for v in runs if v not in ("off", "before")]
    for a, b in pairs:
        per_request = [(x.cpu_per_request or 0) / (y.cpu_per_request or 1) for x, y in zip(runs[a], runs[b], strict=True)]
        per_chunk = [(x.cpu_per_chunk or 0) / (y.cpu_per_chunk or 1) for x, y in zip(runs[a], runs[b], strict=True)]
        lines.append(
            f"| {a} / {b} | {', '.join(f'{r:.2f}' for r in per_request)} | {statistics.median(per_request):.3f} "
            f"| {', '.join(f'{r:.2f}' for r in per_chunk)} | {statistics.median(per_chunk):.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
