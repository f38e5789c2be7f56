"""A small, neutral least-in-flight HTTP balancer for the envelope's data-parallel baselines.

`python -m loadtest.envelope.balancer --port P --upstream URL --upstream URL ...` relays every
request to the upstream with the fewest requests in flight (ties go round-robin), and relays the
request and response bytes as they are, the response streamed chunk by chunk as it arrives. A
request counts as in flight from the choice until its response has been relayed to the end or the
client left, so the counts are exact and return to zero. It is what nginx's `least_conn` upstream
does for a user who runs K SGLang servers on one node; like nginx with `proxy_next_upstream off`,
a request whose upstream cannot be reached gets a 502 instead of being retried elsewhere.
`GET /_balancer/status` (the only path it answers itself) shows the upstreams and their counts.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence

import aiohttp
import uvloop
from aiohttp import web

# Headers that describe one hop, not the message (RFC 9110 7.6.1); aiohttp sets its own.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})
STATUS_PATH = "/_balancer/status"


class LeastInFlight:
    """The upstreams and their exact in-flight counts; `acquire` picks the least busy one."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is needed")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.inflight = [0] * len(self.upstreams)
        self._next = 0  # where the round-robin among equally busy upstreams starts

    def acquire(self) -> int:
        """The index of the upstream with the fewest in flight (counted in); ties rotate."""
        n = len(self.upstreams)
        order = [(self._next + i) % n for i in range(n)]
        index = min(order, key=lambda i: self.inflight[i])
        self._next = (index + 1) % n
        self.inflight[index] += 1
        return index

    def release(self, index: int) -> None:
        """One request to upstream `index` ended."""
        self.inflight[index] -= 1


def _forwarded(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    # A list keeps repeated headers (Set-Cookie, ...) as they came.
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]


def bad_gateway(upstream: str, exc: BaseException) -> web.Response:
    """The 502 of an unreachable upstream, as an OpenAI-style error."""
    message = f"upstream {upstream} unreachable: {type(exc).__name__}: {exc}"
    return web.json_response(
        {"error": {"message": message, "type": "server_error", "param": None, "code": "bad_gateway"}}, status=502
    )


class Balancer:
    """The aiohttp application: every path relayed to the least busy upstream."""

    def __init__(self, upstreams: Sequence[str], connect_timeout: float = 10.0) -> None:
        self.pool = LeastInFlight(upstreams)
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        """The web application (its session opens and closes with it)."""
        app = web.Application(client_max_size=0)
        app.router.add_get(STATUS_PATH, self.status)
        app.router.add_route("*", "/{tail:.*}", self.relay)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            auto_decompress=False,  # relay the bytes as the upstream sent them
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def status(self, _: web.Request) -> web.Response:
        """The upstreams and their in-flight counts."""
        pool = self.pool
        return web.json_response({
            "upstreams": [{"url": u, "inflight": n} for u, n in zip(pool.upstreams, pool.inflight, strict=True)],
            "inflight": sum(pool.inflight),
        })

    async def relay(self, request: web.Request) -> web.StreamResponse:
        """Send the request to the least busy upstream and stream its response back unchanged."""
        assert self._session is not None
        body = await request.read()
        index = self.pool.acquire()
        upstream = self.pool.upstreams[index]
        try:
            try:
                up = await self._session.request(
                    request.method, upstream + request.raw_path, headers=_forwarded(request.headers),
                    data=body or None, allow_redirects=False,
                )
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                return bad_gateway(upstream, exc)
            try:
                response = web.StreamResponse(status=up.status, reason=up.reason, headers=_forwarded(up.headers))
                if up.content_length is not None:
                    response.content_length = up.content_length
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
            finally:
                up.close()  # an unfinished body closes the connection, which aborts the upstream request
        finally:
            self.pool.release(index)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the balancer until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m loadtest.envelope.balancer", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", action="append", required=True, help="an upstream base URL (repeat)")
    args = parser.parse_args(argv)
    web.run_app(
        Balancer(args.upstream).app(), host=args.host, port=args.port, print=None, access_log=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
