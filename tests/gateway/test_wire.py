"""The gateway's own HTTP/1.1 client against small loopback servers that script every byte."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.upstream.connection_pool import WirePool
from gateway.upstream.errors import BadResponse, BodyDropped, ConnectFailed, LocalResourceError
from gateway.upstream.http11 import Connection, WireResponse

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One whole request (head and Content-Length body); b"" when the client closed instead."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    match = re.search(rb"Content-Length: (\d+)", head)
    return head + await reader.readexactly(int(match.group(1)) if match else 0)


class Server:
    """Counts the connections it accepted and the requests it read; runs `handler` on each connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.client_closed = asyncio.Event()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        request = await read_request(reader)
        self.requests.append(request)
        return request


@asynccontextmanager
async def serving(handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], **pool: Any) -> AsyncIterator[tuple[Server, WirePool]]:
    server = Server(lambda r, w: handler(server, r, w))
    listener = await asyncio.start_server(server._accept, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    options = {"connect_timeout": 5.0, "first_byte_timeout": 5.0, "max_connections": 4, **pool}
    client = WirePool(f"http://127.0.0.1:{port}", headers={"Content-Type": "application/json"}, **options)
    try:
        async with asyncio.timeout(20):
            yield server, client
    finally:
        await client.close()
        listener.close()


async def answer_each(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request on the connection with its own number, until the client closes."""
    while await server.request(reader):
        writer.write(ok(b'{"n":%d}' % len(server.requests)))
        await writer.drain()


async def test_a_connection_is_reused_after_a_complete_response() -> None:
    async with serving(answer_each) as (server, pool):
        for n in (1, 2, 3):
            resp = await pool.post("/v1/chat/completions", b'{"a":1}')
            assert resp.status == 200 and resp.headers.get("content-TYPE") == "application/json"
            assert await resp.read() == b'{"n":%d}' % n
            resp.release()
        assert server.connections == 1 and pool.open_connections == 1
        head = server.requests[0]
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"Content-Length: 7\r\n\r\n" in head and head.endswith(b'{"a":1}')


async def test_a_response_the_backend_closes_is_not_reused() -> None:
    async def close_each(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(ok(b"{}", b"Connection: close\r\n"))

    async with serving(close_each) as (server, pool):
        for _ in range(2):
            resp = await pool.post("/", b"{}")
            assert await resp.read() == b"{}"
        assert server.connections == 2


def feed(pieces: list[bytes]) -> WireResponse:
    """A response parsed from `pieces`, each handed to the protocol as one socket read."""
    conn = Connection(lambda c: None, lambda c, was: None)

    class Transport:
        def write(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            pass

    conn.connection_made(Transport())  # type: ignore[arg-type]
    resp = WireResponse(conn)
    conn.send(b"", resp)
    for piece in pieces:
        conn.data_received(piece)
    return resp


async def frames(resp: WireResponse, separator: bytes) -> list[bytes]:
    out = []
    while frame := await resp.readuntil(separator):
        out.append(frame)
    return out


async def test_chunked_events_split_anywhere_across_reads_come_out_whole() -> None:
    events = [b"data: {\"a\":1}\n\n", b"data: {\"b\":22}\n\n", b"data: [DONE]\n\n"]
    # Two events in one chunk, one event over two chunks.
    raw = CHUNKED + chunk(events[0] + events[1][:5]) + chunk(events[1][5:]) + chunk(events[2]) + b"0\r\n\r\n"
    for cut in range(1, len(raw)):
        resp = feed([raw[:cut], raw[cut:]])
        assert await frames(resp, b"\n\n") == events, cut
    resp = feed([raw[i : i + 1] for i in range(len(raw))])
    assert await frames(resp, b"\n\n") == events


async def test_a_content_length_body_is_read_whole_across_reads() -> None:
    body = b'{"choices":[]}' * 50
    raw = ok(body)
    resp = feed([raw[:40], raw[40:300], raw[300:]])
    assert resp.status == 200 and await resp.read() == body


async def test_a_stream_that_ends_cleanly_early_hands_back_its_incomplete_rest() -> None:
    resp = feed([CHUNKED + chunk(b"data: 1\n\n") + chunk(b"data: {\"ch") + b"0\r\n\r\n"])
    assert await resp.readuntil(b"\n\n") == b"data: 1\n\n"
    assert await resp.readuntil(b"\n\n") == b'data: {"ch'  # the relay calls this truncated


async def test_a_connection_closed_before_the_status_line_is_a_connect_failure() -> None:
    async def close_at_once(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)

    async with serving(close_at_once) as (server, pool):
        with pytest.raises(ConnectFailed):
            await pool.post("/", b"{}")
        assert server.connections == 1 and pool.open_connections == 0  # a new connection is not retried


async def test_a_kept_alive_connection_closed_as_the_request_goes_out_is_retried_once_on_a_new_one() -> None:
    async def first_answers_then_closes(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if server.connections == 1:
            await server.request(reader)
            writer.write(ok(b"{}"))
            await server.request(reader)  # the second request, read and dropped unanswered
        else:
            await answer_each(server, reader, writer)

    async with serving(first_answers_then_closes) as (server, pool):
        assert await (await pool.post("/", b"{}")).read() == b"{}"
        resp = await pool.post("/", b"{}")
        assert resp.status == 200 and await resp.read() == b'{"n":3}'
        assert server.connections == 2 and len(server.requests) == 3


async def test_a_refused_connection_is_a_connect_failure_with_its_os_error() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    pool = WirePool(f"http://127.0.0.1:{port}", headers={}, connect_timeout=5, first_byte_timeout=5, max_connections=1)
    with pytest.raises(ConnectFailed) as caught:
        await pool.post("/", b"{}")
    assert isinstance(caught.value.__cause__, OSError)
    assert not pool.full and pool.open_connections == 0


async def test_garbage_instead_of_http_is_a_bad_response() -> None:
    async def garbage(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await reader.read()

    async with serving(garbage) as (_, pool):
        with pytest.raises(BadResponse):
            await pool.post("/", b"{}")
        assert pool.open_connections == 0


async def test_eof_inside_a_body_is_a_dropped_body() -> None:
    async def half(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)

    async def half_stream(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(CHUNKED + chunk(b"data: 1\n\ndata: 2"))

    async with serving(half) as (_, pool):
        resp = await pool.post("/", b"{}")
        with pytest.raises(BodyDropped):
            await resp.read()
    async with serving(half_stream) as (_, pool):
        resp = await pool.post("/", b"{}")
        assert await resp.readuntil(b"\n\n") == b"data: 1\n\n"  # what arrived whole still goes out
        with pytest.raises(BodyDropped):
            await resp.readuntil(b"\n\n")


async def test_a_pool_that_stays_full_past_the_connect_timeout_is_pool_full() -> None:
    async def hold(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        await reader.read()  # never answers

    async with serving(hold, max_connections=1, connect_timeout=0.2, first_byte_timeout=30) as (server, pool):
        holder = asyncio.create_task(pool.post("/", b"{}"))
        while not server.requests:
            await asyncio.sleep(0.01)
        assert pool.full and pool.open_connections == 1
        with pytest.raises(LocalResourceError) as caught:
            await pool.post("/", b"{}")
        assert caught.value.kind == "pool_full" and server.connections == 1
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        assert not pool.full and pool.open_connections == 0  # the cancelled exchange closed its connection


async def test_a_queued_request_gets_the_connection_the_exchange_before_it_left() -> None:
    go = asyncio.Event()

    async def slow_first(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(ok(b'{"n":1}')[:-3])
        await go.wait()
        writer.write(b":1}")
        await answer_each(server, reader, writer)

    async with serving(slow_first, max_connections=1) as (server, pool):
        first = await pool.post("/", b"{}")
        queued = asyncio.create_task(pool.post("/", b"{}"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert pool.full and not queued.done()
        go.set()
        assert await first.read() == b'{"n":1}'
        assert await (await queued).read() == b'{"n":2}'
        assert server.connections == 1


async def test_the_first_byte_timeout_closes_the_connection() -> None:
    async def silent(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        await reader.read()
        server.client_closed.set()

    async with serving(silent, first_byte_timeout=0.2) as (server, pool):
        with pytest.raises(TimeoutError):
            await pool.post("/", b"{}")
        await server.client_closed.wait()
        assert pool.open_connections == 0


async def test_closing_mid_stream_closes_the_socket() -> None:
    async def stream(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(CHUNKED + chunk(b"data: 1\n\n"))
        assert await reader.read() == b""  # EOF: the client hung up, as SGLang sees an abort
        server.client_closed.set()

    async with serving(stream) as (server, pool):
        resp = await pool.post("/", b"{}")
        assert await resp.readuntil(b"\n\n") == b"data: 1\n\n"
        resp.close()
        assert pool.open_connections == 0 and not pool.full
        await server.client_closed.wait()


async def test_an_idle_connection_the_backend_closes_leaves_the_pool() -> None:
    async def answer_then_close(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(ok(b"{}"))
        await writer.drain()

    async with serving(answer_then_close) as (server, pool):
        assert await (await pool.post("/", b"{}")).read() == b"{}"
        while pool.open_connections:  # until the FIN arrives
            await asyncio.sleep(0.01)
        assert await (await pool.post("/", b"{}")).read() == b"{}"
        assert server.connections == 2



async def test_a_reader_that_falls_behind_pauses_the_socket_and_gets_every_frame() -> None:
    event = b"data: " + b"x" * 1000 + b"\n\n"
    count = 600  # ~600 KB: beyond what the response buffers before it stops reading

    async def flood(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(CHUNKED)
        for _ in range(count // 10):
            writer.write(chunk(event * 10))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await answer_each(server, reader, writer)

    async with serving(flood) as (server, pool):
        resp = await pool.post("/", b"{}")
        conn = resp._conn
        assert conn is not None
        while not conn.paused:  # the reader has not read yet: the buffer fills until the socket pauses
            await asyncio.sleep(0.01)
        got = await frames(resp, b"\n\n")
        assert got == [event] * count and not conn.paused
        assert await (await pool.post("/", b"{}")).read() == b'{"n":2}'
        assert server.connections == 1  # the whole response came, so the connection was reused
