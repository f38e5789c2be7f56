"""Benchmark: client CPU per SSE event, hand-written decoder vs SSE libraries, on the same aiohttp stream.

A separate server process streams OpenAI-style chat chunks; the client reads them over one
long-lived aiohttp session with each decoder and reports client CPU microseconds per event
(every variant also JSON-decodes each event with orjson, as the load generator does).

    pip install httpx-sse==0.4.3 aiohttp-sse-client2==0.3.0   # the libraries compared against
    python -m benchmarks.sse_bench [--streams 64] [--events 400] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import click
import orjson
from aiohttp import web

from backends.process import free_loopback_port
from loadtest.sse import SSEDecoder

_CHUNK = (
    b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764400000,'
    b'"model":"sim-model","choices":[{"index":0,"delta":{"role":null,"content":" word word word"},'
    b'"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
)


def _serve(port: int, events: int) -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(events):
            await resp.write(_CHUNK)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_route("*", "/stream", stream)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


async def _own(session: aiohttp.ClientSession, url: str) -> int:
    n = 0
    decoder = SSEDecoder()
    async with session.post(url) as resp:
        async for line in resp.content:
            data = decoder.feed(line)
            if data is None or data == b"[DONE]":
                continue
            orjson.loads(data)
            n += 1
    return n


async def _httpx_sse_decoder(session: aiohttp.ClientSession, url: str) -> int:
    from httpx_sse._decoders import SSEDecoder as LibDecoder

    n = 0
    decoder = LibDecoder()
    async with session.post(url) as resp:
        async for line in resp.content:
            event = decoder.decode(line.decode().rstrip("\r\n"))
            if event is None or event.data == "[DONE]":
                continue
            orjson.loads(event.data)
            n += 1
    return n


async def _aiohttp_sse_client2(session: aiohttp.ClientSession, url: str) -> int:
    from aiohttp_sse_client2.client import EventSource

    n = 0
    async with EventSource(url, session=session, option={"method": "POST"}, max_connect_retry=0) as source:
        async for event in source:
            if event.data == "[DONE]":
                break
            orjson.loads(event.data)
            n += 1
    return n


Reader = Callable[[aiohttp.ClientSession, str], Awaitable[int]]
READERS: dict[str, Reader] = {
    "hand-written (loadtest.sse)": _own,
    "httpx-sse SSEDecoder": _httpx_sse_decoder,
    "aiohttp-sse-client2 EventSource": _aiohttp_sse_client2,
}


async def _measure(reader: Reader, url: str, streams: int) -> tuple[float, int]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:
        await reader(session, url)  # warm the pool and imports
        cpu = time.process_time()
        counts = await asyncio.gather(*(reader(session, url) for _ in range(streams)))
        return time.process_time() - cpu, sum(counts)


@click.command()
@click.option("--streams", default=64, show_default=True)
@click.option("--events", default=400, show_default=True)
@click.option("--rounds", default=3, show_default=True)
def main(streams: int, events: int, rounds: int) -> None:
    """Print client CPU microseconds per event for each decoder (median of rounds)."""
    port = free_loopback_port()
    server = multiprocessing.Process(target=_serve, args=(port, events), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}/stream"
        time.sleep(1.0)
        print(f"{streams} concurrent streams x {events} events, median of {rounds} rounds\n")
        print("| decoder | client CPU us/event |\n|---|---|")
        for name, reader in READERS.items():
            per_event = []
            for _ in range(rounds):
                cpu, n = asyncio.run(_measure(reader, url, streams))
                per_event.append(cpu / n * 1e6)
            print(f"| {name} | {statistics.median(per_event):.1f} |")
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
