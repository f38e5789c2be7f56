"""Benchmark: the streaming relay's own CPU per chunk, without sockets: pulled against pushed.

A `gateway.wire.Connection` is fed an SGLang-shaped chunked SSE response by hand (its transport
is a stand-in) and `gateway.relay.relay_stream` relays it to a stand-in client: uvicorn's request
cycle as the body writer sees it, with a transport that drops what it is given. Pulled: each chunk
is fed, then the event loop runs the relay task until the chunk is sent (a task wake-up and an
awaited `send` per event). Pushed: the chunk is relayed inside `data_received` and written with the
`BodyWriter`, whole token chunks by the C extension's `TokenSink` where it is built; "pushed, Python
rule" is the same relay with the extension set aside (what a build without a C compiler runs). Each
token chunk gets the proxy's bookkeeping (a pool slot's `mark_token`, the inter-token gap's bucket).
The socket calls a real relay adds (a read and a write per chunk, and the event loop's poll) are
not here: this is the interpreter's share, which does not drift with the machine's load the way the
end-to-end numbers of `benchmarks/gateway_overhead.py` do. Best of `--repeat`.

`--python` adds interpreters (each with specgate's dependencies installed, run from this checkout):
every one runs the same measurement in its own process, alternating run by run, so builds of
Python compare side by side.

    python -m benchmarks.relay_cost --python .venv-system/bin/python --out docs/benchmarks/relay-cost.md
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop
from prometheus_client import CollectorRegistry, Histogram

from benchmarks.output import interpreter, publish
from gateway.edge.body_writer import BodyWriter
from gateway.pool.backends import Backend, Pool
from gateway.relay import sse as relay
from gateway.relay.gaps import GapBuffer
from gateway.upstream.http11 import Connection, WireResponse

# A chat chunk as SGLang 0.5 streams it (one token of content, usage null).
CHUNK = b"data: " + orjson.dumps({
    "id": "0123456789abcdef0123456789abcdef", "object": "chat.completion.chunk", "created": 1764547200,
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "choices": [{"index": 0, "delta": {"role": None, "content": " token", "reasoning_content": None, "tool_calls": None},
                 "logprobs": None, "finish_reason": None, "matched_stop": None}],
    "usage": None,
}) + b"\n\n"
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Socket:
    """Both sockets: writes are dropped, reading is never paused for long."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


class _Flow:
    write_paused = False

    async def drain(self) -> None:
        pass


class _Cycle:
    """uvicorn's request cycle as `BodyWriter` and the relay see it; counts the bodies sent."""

    def __init__(self) -> None:
        self.transport = _Socket()
        self.flow = _Flow()
        self.sent = 0

    async def send(self, message: dict[str, Any]) -> None:
        self.sent += 1


_NATIVE = relay.TokenSink
# mode -> (pushed, with the C extension's TokenSink)
MODES = {"pulled": (False, False), "pushed": (True, True), "pushed, Python rule": (True, False)}


async def _per_chunk(mode: str, chunks: int, itl: Histogram) -> float:
    push, native = MODES[mode]
    relay.TokenSink = _NATIVE if native else None  # read when the relay starts
    conn = Connection(lambda c: None, lambda c, was: None)
    conn.connection_made(_Socket())  # type: ignore[arg-type]
    resp = WireResponse(conn)
    conn.send(b"", resp)
    conn.data_received(_HEAD)
    cycle = _Cycle()
    gaps = GapBuffer(itl)
    slot = Pool([Backend("plain", "http://127.0.0.1:1", speculative=False)]).acquire("plain")  # the proxy's bookkeeping
    task = asyncio.create_task(relay.relay_stream(
        resp, cycle.send, strip_usage=True, idle_timeout=600.0, on_first=lambda now: None, on_token=slot.mark_token,
        on_gap=gaps.observe, writer=BodyWriter(cycle) if push else None,
    ))
    await asyncio.sleep(0)  # the relay starts waiting for the first event
    piece = _chunked(CHUNK)
    started = time.perf_counter()
    for _ in range(chunks):
        conn.data_received(piece)
        while not push and cycle.sent < 1:  # pulled: the relay task sends it on its turn
            await asyncio.sleep(0)
        cycle.sent = 0
    spent = time.perf_counter() - started
    conn.data_received(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await task
    return spent / chunks


async def _run(chunks: int, repeat: int) -> dict[str, float]:
    itl = Histogram("itl_seconds", "inter-token gaps", registry=CollectorRegistry())
    best = dict.fromkeys(MODES, float("inf"))
    for _ in range(repeat):  # alternating, so every mode sees the same machine
        for mode in MODES:
            best[mode] = min(best[mode], await _per_chunk(mode, chunks, itl))
    return best


def _child(python: str, chunks: int) -> dict[str, float | str]:
    """One run of the measurement in `python`'s own process, from this checkout."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([python, "-m", "benchmarks.relay_cost", "--child", "--chunks", str(chunks)],
                         cwd=root, check=True, capture_output=True)
    return orjson.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--python", action="append", default=[], help="another interpreter to measure (repeatable)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one run, JSON on stdout
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        best = uvloop.run(_run(args.chunks, 1))
        sys.stdout.write(orjson.dumps({**best, "interpreter": interpreter()}).decode())
        return
    pythons = [sys.executable, *args.python]
    runs: dict[str, list[dict[str, float | str]]] = {python: [] for python in pythons}
    for _ in range(args.repeat):  # alternating, so every interpreter sees the same machine
        for python in pythons:
            runs[python].append(_child(python, args.chunks))
    extra = "".join(f" --python {python}" for python in args.python)
    lines = [
        "# The streaming relay's own CPU per chunk, without sockets",
        "",
        f"Command: `python -m benchmarks.relay_cost --chunks {args.chunks} --repeat {args.repeat}{extra}` (uvloop). "
        f"A {len(CHUNK)}-byte SGLang chat chunk per read, relayed to a client whose socket drops the bytes; best of "
        "the runs, each interpreter in its own process, alternating. The socket calls every proxy pays per chunk "
        "(read, write, poll) are not included. Pushed: whole token chunks relayed by the C extension "
        "(`gateway/relay/_sse.c`'s TokenSink); pushed, Python rule: the same relay without it.",
        "",
        "| interpreter | relay | µs per chunk | against pulled | against the first interpreter |",
        "|---|---|---|---|---|",
    ]
    first: dict[str, float] = {}
    for python in pythons:
        for name in MODES:
            seconds = min(float(run[name]) for run in runs[python])
            first.setdefault(name, seconds)
            pulled = min(float(run["pulled"]) for run in runs[python])
            lines.append(f"| {runs[python][0]['interpreter']} | {name} | {seconds * 1e6:.2f} | {seconds / pulled:.2f}x "
                         f"| {seconds / first[name]:.2f}x |")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
