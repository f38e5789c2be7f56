"""A stand-in for SMG's `smg` command, so the default suite runs the envelope's SMG baselines without it.

`--version` answers `smg 0.0.0-standin`. `launch --host H --port P --worker-urls URL... [SMG's other
flags, ignored]` logs a startup line shaped like SMG's (`... | policy: CacheAware { ... } | ...`),
lists its workers healthy at `GET /workers` (what the envelope waits for), and relays every other
request to one worker, streaming the answer back: a chat to the worker its first message was first
sent to, a new first message to the worker with the fewest (the affinity SMG's cache_aware policy
gives a shared-prefix workload). Run as `python tests/loadtest/smg_standin.py ARGS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import aiohttp
import orjson
from aiohttp import web

VERSION = "0.0.0-standin"
POLICY_SETTINGS = "CacheAware { cache_threshold: 0.3 }"


class PrefixAffinity:
    """Each first message stays with the worker it was first sent to; new ones go to the worker with the fewest."""

    def __init__(self, workers: Sequence[str]) -> None:
        self.workers = [w.rstrip("/") for w in workers]
        self.owner: dict[str, int] = {}
        self.keys = [0] * len(self.workers)

    def pick(self, body: bytes) -> str:
        """The worker for a request body (one that names no messages goes to the first worker)."""
        try:
            messages = orjson.loads(body).get("messages") or []
        except (orjson.JSONDecodeError, AttributeError):  # no body, or not a JSON object
            messages = []
        if not messages:
            return self.workers[0]
        key = str(messages[0].get("content"))
        if key not in self.owner:
            self.owner[key] = min(range(len(self.workers)), key=lambda i: self.keys[i])
            self.keys[self.owner[key]] += 1
        return self.workers[self.owner[key]]


def app(affinity: PrefixAffinity) -> web.Application:
    """`GET /workers`, and every other path relayed to the worker `affinity` picks."""
    session: list[aiohttp.ClientSession] = []

    async def workers(_: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": w, "is_healthy": True} for w in affinity.workers]})

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        url = affinity.pick(body) + request.raw_path
        async with session[0].request(request.method, url, data=body or None, headers=headers) as up:
            response = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def opened(_: web.Application) -> None:
        session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)))

    async def closed(_: web.Application) -> None:
        await session[0].close()

    application = web.Application(client_max_size=0)
    application.router.add_get("/workers", workers)
    application.router.add_route("*", "/{tail:.*}", relay)
    application.on_startup.append(opened)
    application.on_cleanup.append(closed)
    return application


def main(argv: Sequence[str]) -> None:
    """`--version`, or `launch ...`: serve until SIGTERM."""
    if list(argv) == ["--version"]:
        print(f"smg {VERSION}")
        return
    parser = argparse.ArgumentParser(prog="smg")
    parser.add_argument("command", choices=["launch"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker-urls", nargs="+", required=True)
    args, _ = parser.parse_known_args(argv)
    print(f"Starting router on {args.host}:{args.port} | policy: {POLICY_SETTINGS} | max_payload: 512MB", flush=True)
    web.run_app(app(PrefixAffinity(args.worker_urls)), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
