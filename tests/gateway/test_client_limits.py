"""Slow and greedy clients against the gateway's HTTP protocol, through a real uvicorn on loopback.

Timeouts here are short (a fraction of a second); every wait is a deadline several times longer
than the timeout, and every time asserted is a lower bound (a timer never fires early).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.edge.client_cap import ClientCap
from gateway.edge.http_protocol import ConnectionLimits
from gateway.pool.board import LocalBoard
from tests.gateway.test_http_protocol import LIMIT, error_of, ok_app, read_to_close, serving

SHORT = 0.4  # the timeouts under test
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"


class BodyApp:
    """Reads the whole body, then answers 200 with its length; remembers how each read ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.release = asyncio.Event()  # a request to /slow is answered, one to /late read, once this is set

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/late":  # reads nothing until released: the server's own wait
            await self.release.wait()
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.ended.append("disconnect")
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        self.ended.append("body")
        if scope["path"] == "/slow":
            await self.release.wait()
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def limited(app: Any, **limits: Any) -> AsyncIterator[tuple[int, list[str]]]:
    """`app` served with SHORT head and body timeouts (or `limits`); the phases of the connections it timed out."""
    timed_out: list[str] = []
    settings = {"header_timeout": SHORT, "body_timeout": SHORT, **limits}
    async with serving(app, ConnectionLimits(LIMIT, on_timeout=timed_out.append, **settings)) as port:
        yield port, timed_out


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def test_a_head_that_never_completes_gets_408_after_the_header_timeout() -> None:
    async with limited(ok_app) as (port, timed_out):
        reader, writer = await connect(port)
        sent = time.monotonic()
        writer.write(HEAD)  # slowloris: a request line and a header, then nothing
        response = await read_to_close(reader, within=SHORT + 5)
        assert time.monotonic() - sent >= SHORT * 0.9
        writer.close()
    assert response.startswith(b"HTTP/1.1 408 ")
    assert error_of(response) == {
        "message": f"the request head did not arrive within {SHORT:g} s", "type": "invalid_request_error",
        "param": None, "code": "request_timeout",
    }
    assert timed_out == ["head"]


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer() -> None:
    async with limited(ok_app) as (port, timed_out):
        reader, writer = await connect(port)
        assert await read_to_close(reader, within=SHORT + 5) == b""
        writer.close()
    assert timed_out == ["head"]


async def trickle(writer: asyncio.StreamWriter, pieces: list[bytes], every: float) -> None:
    """Send `pieces` one by one, `every` seconds apart, until they run out or the server closes."""
    for piece in pieces:
        if writer.is_closing():
            return
        writer.write(piece)
        try:
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(every)


@pytest.mark.parametrize(
    ("pieces", "answered"),
    [
        pytest.param([b"\r\n"] * 1000, False, id="line-breaks"),  # parse as nothing: no request to answer
        pytest.param([bytes([c]) for c in HEAD + b"x-endless: " + b"a" * 1000], True, id="a-byte-at-a-time"),
    ],
)
async def test_bytes_that_keep_coming_do_not_extend_the_header_timeout(pieces: list[bytes], answered: bool) -> None:
    # On a kept-alive connection, where each read cancels uvicorn's keep-alive timer.
    async with limited(ok_app) as (port, timed_out):
        reader, writer = await connect(port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
        sender = asyncio.create_task(trickle(writer, pieces, SHORT / 8))
        response = await read_to_close(reader, within=SHORT + 5)
        sender.cancel()
        writer.close()
    assert response.startswith(b"HTTP/1.1 408 ") if answered else response == b"", response
    assert timed_out == ["head"]


async def test_a_body_that_stops_coming_gets_408_and_the_app_sees_the_client_leave() -> None:
    app = BodyApp()
    async with limited(app) as (port, timed_out):
        reader, writer = await connect(port)
        writer.write(HEAD + b"content-length: 100000\r\ncontent-type: application/json\r\n\r\n{")  # slow POST
        sent = time.monotonic()
        response = await read_to_close(reader, within=SHORT + 5)
        assert time.monotonic() - sent >= SHORT * 0.9
        writer.close()
        async with asyncio.timeout(5):
            while not app.ended:
                await asyncio.sleep(0.01)
    assert response.startswith(b"HTTP/1.1 408 ") and b"connection: close" in response
    assert error_of(response)["message"] == f"the request body did not arrive within {SHORT:g} s"
    assert app.ended == ["disconnect"]  # nothing was answered twice, and the app stopped reading
    assert timed_out == ["body"]


async def test_a_body_may_take_longer_than_the_timeout_while_its_pieces_keep_coming() -> None:
    app = BodyApp()
    body = b"x" * 12
    async with limited(app, body_timeout=2.0) as (port, timed_out):
        reader, writer = await connect(port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 12\r\n\r\n")
        await trickle(writer, [bytes([c]) for c in body], 0.25)  # 3 s in all, each gap far below 2 s
        response = await read_to_close(reader)
        writer.close()
    assert response.startswith(b"HTTP/1.1 200 ") and response.endswith(b"\r\n\r\n12")
    assert timed_out == []


async def test_a_kept_alive_connection_may_idle_longer_than_the_header_timeout() -> None:
    # Between requests uvicorn's keep-alive timeout governs; the next head counts from its first byte.
    async with limited(ok_app, header_timeout=0.2) as (port, timed_out):
        reader, writer = await connect(port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
        await asyncio.sleep(1.0)  # five header timeouts, within uvicorn's keep-alive (5 s)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert (await read_to_close(reader)).startswith(b"HTTP/1.1 200 ")
        writer.close()
    assert timed_out == []


async def test_a_head_waiting_behind_a_running_response_is_not_timed_out() -> None:
    app = BodyApp()
    async with limited(app, header_timeout=0.2) as (port, timed_out):
        reader, writer = await connect(port)
        # The next request's head is half sent while the first one's response is still being made.
        writer.write(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\nGET / HTTP/1.1\r\n")
        async with asyncio.timeout(5):
            while app.ended != ["body"]:
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # five header timeouts
        app.release.set()
        assert (await reader.readuntil(b"\r\n\r\n0")).startswith(b"HTTP/1.1 200 ")
        writer.write(b"host: x\r\nconnection: close\r\n\r\n")
        assert (await read_to_close(reader)).startswith(b"HTTP/1.1 200 ")
        writer.close()
    assert timed_out == []


async def test_a_body_the_server_is_not_reading_yet_is_not_timed_out() -> None:
    app = BodyApp()
    body = b"x" * 300_000  # more than uvicorn buffers before it stops reading
    async with limited(app, body_timeout=0.2) as (port, timed_out):
        reader, writer = await connect(port)
        writer.write(b"POST /late HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await asyncio.sleep(1.0)  # five body timeouts while the app reads nothing
        app.release.set()
        response = await read_to_close(reader)
        writer.close()
    assert response.startswith(b"HTTP/1.1 200 ") and response.endswith(b"\r\n\r\n300000")
    assert timed_out == []


async def test_a_head_that_stalls_right_after_a_pipelined_request_is_timed_out() -> None:
    # The stalled head begins in the same read as the request before it (uvicorn's keep-alive timer,
    # 5 s, would close it without a word).
    async with limited(ok_app) as (port, timed_out):
        reader, writer = await connect(port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\n")
        response = await read_to_close(reader, within=10)
        writer.close()
    first, second = response.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 ") and second.startswith(b"408 ")
    assert timed_out == ["head"]


async def test_a_body_sent_after_an_early_answer_does_not_hold_the_connection_open() -> None:
    # ok_app answers after the first piece of the body; each later read cancelled uvicorn's keep-alive timer.
    async with serving(ok_app, ConnectionLimits(LIMIT), timeout_keep_alive=1) as port:
        reader, writer = await connect(port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
        writer.write(b"123456789")  # the rest of the body, then silence
        assert await read_to_close(reader, within=1 + 5) == b""
        writer.close()


async def test_connections_over_the_per_client_cap_are_closed_at_accept() -> None:
    refused: list[None] = []
    cap = ClientCap(LocalBoard(), 2, lambda: refused.append(None))
    async with serving(ok_app, ConnectionLimits(LIMIT, cap=cap)) as port:
        held = [await connect(port) for _ in range(2)]
        for reader, writer in held:
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
        reader, writer = await connect(port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert await read_to_close(reader) == b""  # closed at once, nothing read or answered
        writer.close()
        assert len(refused) == 1
        held[0][1].close()  # one of the two leaves: a new connection fits again
        async with asyncio.timeout(5):
            while True:
                reader, writer = await connect(port)
                writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                if response := await read_to_close(reader):
                    break
                writer.close()
        assert response.startswith(b"HTTP/1.1 200 ")
        held[1][1].close()
