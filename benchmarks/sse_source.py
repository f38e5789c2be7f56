"""A measurement-only SSE source shared by the gateway benchmarks.

It streams SGLang-shaped chat chunks at a fixed step interval for every open request, as a
decode server does, and stamps each chunk with the sender's CLOCK_MONOTONIC time
(`"ts"`), which every process on the machine shares. A client that reads `ts` knows exactly how
long each chunk took to reach it, directly or through the gateway.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson
from aiohttp import web

MODEL = "bench-model"


def _chunk(rid: str, index: int, finish: str | None) -> bytes:
    body = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "ts": time.monotonic(),
        "choices": [{"index": 0, "delta": {"content": f" tok{index}" if finish is None else ""}, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


class StampingSource:
    """aiohttp app: POST /v1/chat/completions streams `max_tokens` chunks, one per `step` seconds."""

    def __init__(self, step: float, *, lockstep: bool = False, instant: bool = False) -> None:
        """`lockstep`: every stream's chunk goes out at the same instants (multiples of `step`), as a
        batched decode step does; `instant`: non-streamed requests are answered at once."""
        self.step = step
        self.lockstep = lockstep
        self.instant = instant
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/ready", self._ok)
        self.app.router.add_get("/health", self._ok)
        self.app.router.add_get("/v1/models", self._models)
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> int:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        # SGLang's uvicorn listens with a 2048 backlog; aiohttp's default of 128 would drop SYNs
        # (1 s retransmits) when 256 clients connect at once, which no real backend does.
        site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=2048)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        req: dict[str, Any] = await request.json(loads=orjson.loads)
        # How long the request took to get here, if the client stamped it (`client_ts`, monotonic).
        inbound = time.monotonic() - req["client_ts"] if "client_ts" in req else None
        n = int(req.get("max_tokens", 16))
        rid = str(req.get("rid", "r"))
        if not req.get("stream"):
            if not self.instant:
                await asyncio.sleep(self.step * n)
            usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            return web.json_response(
                {"id": rid, "object": "chat.completion", "model": MODEL, "ts": time.monotonic(), "inbound": inbound,
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
                 "usage": usage},
                dumps=lambda o: orjson.dumps(o).decode(),
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        for i in range(n):
            deadline = (math.floor(loop.time() / self.step) + 1) * self.step if self.lockstep else deadline + self.step
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            await resp.write(_chunk(rid, i, None))
        await resp.write(_chunk(rid, n, "length"))
        if (req.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            await resp.write(b"data: " + orjson.dumps({"id": rid, "choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


def main() -> None:
    """Run the source standalone: `python benchmarks/sse_source.py --port N --step SECONDS`."""
    import argparse

    import uvloop

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step", type=float, default=0.02)
    parser.add_argument("--lockstep", action="store_true", help="all streams' chunks at the same instants")
    parser.add_argument("--instant", action="store_true", help="answer non-streamed requests at once")
    args = parser.parse_args()

    async def serve() -> None:
        source = StampingSource(args.step, lockstep=args.lockstep, instant=args.instant)
        await source.start(args.port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
