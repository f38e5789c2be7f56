"""Before and after, per request, per connection and per chunk: what the client limits cost the gateway.

The client timeouts keep one deadline per connection (gateway/edge/read_deadline.py); a read moves
it, a request arms no timer. This measures that against the code before, alternating the two
checkouts' gateways (each from its own tree and `.venv`, threshold policy, benchmarks/gateway_ab.py's
upstream: benchmarks/sse_source.py --lockstep --instant) round by round, with the gateway's own CPU
(its processes' scheduler time, benchmarks/gateway_overhead.py's `_cpu`) divided by the work done:

- per request, kept alive: C=64 connections, each sending non-streamed chats back to back;
- per request, a new connection each (`connection: close`): C=16, so the per-connection deadline,
  its timer and its cancel are in every request;
- per chunk: 256 concurrent streams of 64 chunks (gateway_overhead's stream load).

The load comes from this process (uvloop, raw sockets: no wrk on the machine this was written on).
On a shared machine those figures move by 10% from round to round, so each round also runs
benchmarks/protocol_cost.py with each checkout's Python: its HTTP protocol alone, under a trivial
app and a transport that only takes writes, per connection (with its one request) and per kept-alive
request; the only code that differs there is the protocol's own.

    python -m benchmarks.connection_ab --before /tmp/specgate-before --after . --rounds 6 \\
        --out docs/benchmarks/client-limits.md
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import uvloop

from benchmarks.gateway_ab import _interpreter, ab_parser, start_source, start_tree_gateway
from benchmarks.gateway_overhead import BODY, _cpu, _specgate_config, _streams
from benchmarks.output import publish

_REQUEST = orjson.dumps(BODY)


def _post(close: bool) -> bytes:
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(_REQUEST)}\r\n"
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode() + _REQUEST


async def _answer(reader: asyncio.StreamReader) -> None:
    """Read one response with a content-length (the gateway's non-streamed answer); fail unless 200."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    body = await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200 "):
        status_line = head.split(b"\r\n", 1)[0]
        raise RuntimeError(f"the gateway answered {status_line!r}: {body[:300]!r}")


async def _load(url: str, connections: int, seconds: float, new_connection_each: bool) -> int:
    """Requests completed by `connections` closed-loop clients in `seconds`."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _post(new_connection_each)
    done = 0
    stop = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                while True:
                    writer.write(request)
                    await _answer(reader)
                    done += 1
                    if new_connection_each or time.monotonic() >= stop:
                        break
            finally:
                writer.close()

    await asyncio.gather(*(client() for _ in range(connections)))
    return done


@dataclass
class Round:
    """One gateway's numbers in one round (CPU seconds of the gateway per unit of work)."""

    per_request: float
    per_connection_request: float
    per_chunk: float
    rps: float
    protocol_per_connection: float = 0.0
    protocol_per_request: float = 0.0


def _per(pids: list[int], work: Coroutine[Any, Any, int]) -> tuple[float, int]:
    """The gateway's CPU seconds per unit of `work` (which returns how many units it did), and the units."""
    before = _cpu(pids)
    count = uvloop.run(work)
    return (_cpu(pids) - before) / max(count, 1), count


def measure(url: str, pids: list[int], seconds: float) -> Round:
    """The three loads against one gateway."""
    uvloop.run(_load(url, 8, 1.0, False))  # warm: connections, pools, caches

    async def chunks() -> int:
        return (await _streams(url + "/v1/chat/completions"))[1]

    # The streams first, on a gateway fresh from its warm-up: their figure does not depend on the loads before.
    per_chunk, _ = _per(pids, chunks())
    per_request, requests = _per(pids, _load(url, 64, seconds, False))
    per_connection_request, _ = _per(pids, _load(url, 16, seconds, True))
    return Round(per_request, per_connection_request, per_chunk, requests / seconds)


def protocol_cost(tree: Path) -> tuple[float, float]:
    """benchmarks/protocol_cost.py run by `tree`'s Python (so on its own gateway package): CPU seconds
    per connection and per kept-alive request."""
    script = Path(__file__).with_name("protocol_cost.py")
    out = subprocess.run([str(tree / ".venv/bin/python"), str(script)], cwd=tree, check=True, capture_output=True, text=True)
    figures = orjson.loads(out.stdout)
    return figures["per_connection_us"] / 1e6, figures["per_request_us"] / 1e6


def _row(name: str, r: Round) -> str:
    return (f"| {name} | {r.per_request * 1e6:.1f} | {r.per_connection_request * 1e6:.1f} | {r.per_chunk * 1e6:.2f} "
            f"| {r.rps:,.0f} | {r.protocol_per_connection * 1e6:.1f} | {r.protocol_per_request * 1e6:.2f} |")


def _median(runs: list[Round]) -> Round:
    return Round(*(statistics.median(getattr(r, f) for r in runs) for f in Round.__dataclass_fields__))


def main() -> None:
    parser = ab_parser(__doc__, rounds=6)
    parser.add_argument("--seconds", type=float, default=4.0, help="each load")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    command = "python -m benchmarks.connection_ab " + " ".join(sys.argv[1:])
    lines = [f"Command: `{command}`", ""]
    lines += [f"- {label}: {tree}, {_interpreter(tree)}" for label, tree in trees.items()]
    lines += [
        f"- `[server] workers = {args.workers}`; {args.rounds} rounds, before and after alternating within each",
        "",
        "| | CPU per request, kept alive, C=64 (µs) | CPU per request, new connection each, C=16 (µs) "
        "| CPU per chunk, 256 streams (µs) | req/s, kept alive | protocol alone: per connection (µs) "
        "| protocol alone: per request (µs) |",
        "|---|---|---|---|---|---|---|",
    ]
    runs: dict[str, list[Round]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        source, src = start_source(tmp)
        try:
            config = _specgate_config(tmp, src, args.workers)
            for round_ in range(1, args.rounds + 1):
                order = list(trees.items()) if round_ % 2 else list(trees.items())[::-1]
                for label, tree in order:
                    gateway, url = start_tree_gateway(tree, config, tmp / f"{label}-{round_}.log")
                    try:
                        r = measure(url, [gateway.pid], args.seconds)
                    finally:
                        gateway.stop_blocking(grace=10)
                    r.protocol_per_connection, r.protocol_per_request = protocol_cost(tree)
                    runs[label].append(r)
                    lines.append(_row(f"{label}, round {round_}", r))
                    print(lines[-1], file=sys.stderr, flush=True)
        finally:
            source.stop_blocking(grace=10)
    medians = {label: _median(measured) for label, measured in runs.items()}
    lines += [_row(f"**{label}, median**", m) for label, m in medians.items()]
    b, a = medians["before"], medians["after"]
    lines += [
        "",
        f"After / before (medians): per request kept alive {a.per_request / b.per_request:.3f}, per request on a new "
        f"connection {a.per_connection_request / b.per_connection_request:.3f}, per chunk {a.per_chunk / b.per_chunk:.3f}; "
        f"the protocol alone: {(a.protocol_per_connection - b.protocol_per_connection) * 1e6:+.1f} µs per connection "
        f"(with its request), {(a.protocol_per_request - b.protocol_per_request) * 1e6:+.2f} µs per kept-alive request.",
    ]
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
