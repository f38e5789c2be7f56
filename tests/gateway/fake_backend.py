"""A scriptable stand-in for one SGLang server, on loopback, for unit tests of the gateway's upstream side."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from tests.aioserve import serving_app

MODEL = "fake-model"


def chunk(content: str) -> bytes:
    """One SSE chat chunk carrying `content`."""
    body = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def usage_chunk(completion_tokens: int) -> bytes:
    body = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


@dataclass
class FakeBackend:
    """What the fake answers; change the fields between requests.

    `mode`: "stream" (tokens, usage, [DONE]), "error" (`status` with an OpenAI error body),
    "hang" (never answers), "stall" (one token, then silence).
    """

    mode: str = "stream"
    status: int = 500
    tokens: int = 3
    token_gap: float = 0.01
    text: str = "b"  # the content of every token chunk after the first
    written: int = 0  # token chunks written so far, over all requests
    ready_status: int = 200
    health_status: int = 200
    loads: dict[str, object] | None = None  # its /v1/loads body; None answers 404, as an older SGLang
    card: dict[str, object] = field(default_factory=lambda: {"id": MODEL, "object": "model"})  # its /v1/models entry
    posts: int = 0
    gets: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # of the generation requests, as received
    url: str = ""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.posts += 1
        self.headers.append(dict(request.headers))
        self.bodies.append(await request.read())
        if self.mode == "error":
            error = {"error": {"message": "boom", "type": "server_error", "param": None, "code": "boom"}}
            return web.json_response(error, status=self.status)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("a"))
        self.written += 1
        if self.mode == "stall":
            await asyncio.sleep(3600)
        for _ in range(self.tokens - 1):
            await asyncio.sleep(self.token_gap)
            await resp.write(chunk(self.text))
            self.written += 1
        await resp.write(usage_chunk(self.tokens))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _get(self, request: web.Request) -> web.Response:
        self.gets.append(request.path)
        self.headers.append(dict(request.headers))
        if request.path == "/ready":
            return web.Response(status=self.ready_status)
        if request.path == "/health":
            return web.Response(status=self.health_status)
        if request.path == "/v1/loads":
            return web.json_response(self.loads) if self.loads is not None else web.Response(status=404)
        return web.json_response({"object": "list", "data": [self.card]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        for path in ("/ready", "/health", "/v1/models", "/v1/loads"):
            app.router.add_get(path, self._get)
        return app


# The sockets `refused_url` holds, for the life of the test process.
_HELD: list[socket.socket] = []


@asynccontextmanager
async def serving(fake: FakeBackend) -> AsyncIterator[FakeBackend]:
    """Run `fake` on a free loopback port (its `url` is set) until the block ends."""
    async with serving_app(fake.app()) as url:
        fake.url = url
        yield fake


def refused_url() -> str:
    """A loopback URL whose port this process holds bound and never listens on: a connection is refused, and
    no other server (another test's, run in parallel) can be given the port while the tests run."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"
