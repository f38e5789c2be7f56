"""The data-parallel baselines' least-in-flight balancer, against small in-process upstreams."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from backends.process import free_loopback_port
from loadtest.envelope.balancer import Balancer, LeastInFlight
from tests.aioserve import serving_app

STREAM = [b"data: {\"a\": 1}\n\n", b"data: \xc3\xa9t\xc3\xa9 split", b" across chunks\n\n", b"data: [DONE]\n\n"]


def upstream_app(name: str, release: asyncio.Event, seen: list[str]) -> web.Application:
    """`/hold` waits for `release`; `/stream` sends STREAM in pieces; `/echo` returns the body and a header."""

    async def hold(request: web.Request) -> web.Response:
        seen.append(name)
        await release.wait()
        return web.Response(text=name)

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": name})
        await resp.prepare(request)
        for piece in STREAM:
            await resp.write(piece)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), headers={"X-Raw-Path": request.raw_path})

    app = web.Application()
    app.router.add_post("/hold", hold)
    app.router.add_get("/stream", stream)
    app.router.add_post("/echo", echo)
    return app


def test_ties_rotate_and_the_least_busy_upstream_wins() -> None:
    pool = LeastInFlight(["http://a", "http://b", "http://c"])
    assert [pool.acquire() for _ in range(3)] == [0, 1, 2]
    pool.release(1)
    assert pool.acquire() == 1  # the only one with fewer in flight
    assert pool.inflight == [1, 1, 1]


async def test_least_in_flight_spreads_requests_and_counts_return_to_zero() -> None:
    release = asyncio.Event()
    seen: list[str] = []
    async with serving_app(upstream_app("a", release, seen)) as a, serving_app(upstream_app("b", release, seen)) as b:
        balancer = Balancer([a, b])
        async with serving_app(balancer.app()) as url, aiohttp.ClientSession() as session:
            async def one() -> str:
                async with session.post(f"{url}/hold", data=b"x") as resp:
                    return await resp.text()

            tasks = [asyncio.create_task(one()) for _ in range(6)]
            while len(seen) < 6:
                await asyncio.sleep(0.01)
            assert balancer.pool.inflight == [3, 3]
            async with session.get(f"{url}/_balancer/status") as resp:
                assert (await resp.json())["inflight"] == 6
            release.set()
            answers = await asyncio.gather(*tasks)
    assert sorted(answers) == ["a"] * 3 + ["b"] * 3
    assert balancer.pool.inflight == [0, 0]


async def test_a_stream_is_relayed_byte_exact_with_its_headers() -> None:
    async with serving_app(upstream_app("a", asyncio.Event(), [])) as a:
        balancer = Balancer([a])
        async with serving_app(balancer.app()) as url, aiohttp.ClientSession() as session:
            async with session.get(f"{url}/stream") as resp:
                assert resp.headers["X-Upstream"] == "a" and resp.headers["Content-Type"] == "text/event-stream"
                pieces = [chunk async for chunk in resp.content.iter_any()]
            assert b"".join(pieces) == b"".join(STREAM)
            assert len(pieces) > 1  # streamed as it came, not buffered into one body
            body = bytes(range(256)) * 4
            async with session.post(f"{url}/echo?x=1&y=%20", data=body) as resp:
                assert await resp.read() == body and resp.headers["X-Raw-Path"] == "/echo?x=1&y=%20"
    assert balancer.pool.inflight == [0]


async def test_a_client_that_leaves_mid_stream_is_no_longer_counted() -> None:
    async with serving_app(upstream_app("a", asyncio.Event(), [])) as a:
        balancer = Balancer([a])
        async with serving_app(balancer.app()) as url, aiohttp.ClientSession() as session:
            async with session.get(f"{url}/stream") as resp:
                await resp.content.readany()
                assert balancer.pool.inflight == [1]
                resp.close()
            for _ in range(200):
                if balancer.pool.inflight == [0]:
                    break
                await asyncio.sleep(0.01)
    assert balancer.pool.inflight == [0]


async def test_an_unreachable_upstream_gets_a_502_in_openai_shape() -> None:
    down = f"http://127.0.0.1:{free_loopback_port()}"
    balancer = Balancer([down])
    async with serving_app(balancer.app()) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json={"model": "m"}) as resp:
            assert resp.status == 502
            error = (await resp.json())["error"]
    assert error["code"] == "bad_gateway" and down in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert balancer.pool.inflight == [0]
