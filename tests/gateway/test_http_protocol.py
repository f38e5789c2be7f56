"""The HTTP protocol subclass, through a real uvicorn server on loopback.

`GatewayHttpProtocol` subclasses uvicorn's private `HttpToolsProtocol` (uvicorn is pinned in
pyproject.toml). If an upgrade renames or reshapes what it overrides, these tests fail here,
loudly, rather than the 431 silently disappearing in production.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import gc
import socket
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.edge.body_writer import body_writer
from gateway.edge.client_watch import watch_client
from gateway.edge.http_protocol import ConnectionLimits, GatewayHttpProtocol

LIMIT = 2048


async def ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


CYCLES: list[weakref.ref[Any]] = []  # each request writer_app served: its server-side request cycle


async def writer_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Streams two events with the server's body writer; says whether a wrapped `send` got one too."""
    await receive()
    CYCLES.append(weakref.ref(send.__self__))

    async def wrapped(message: Any) -> None:  # what a middleware that looks at the body passes on
        await send(message)

    writer = body_writer(scope, send)
    assert writer is not None
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    writer.write(b"data: 1\n\n")
    writer.write(b"")  # never the empty chunk that would end the response
    writer.write(b"data: 2\n\n")
    last = b"wrapped send bypassed\n" if body_writer(scope, wrapped) is not None else b""
    await send({"type": "http.response.body", "body": last, "more_body": False})


@asynccontextmanager
async def serving(app: Any, limits: ConnectionLimits | None = None, **config: Any) -> AsyncIterator[int]:
    """`app` under uvicorn with the gateway's protocol on a free loopback port; `config`: uvicorn's."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    protocol = functools.partial(GatewayHttpProtocol, limits=limits or ConnectionLimits(LIMIT))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, log_config=None, lifespan="off", **config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    async with asyncio.timeout(10):
        while not server.started:
            await asyncio.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    await asyncio.wait_for(task, 10)
    sock.close()


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with serving(ok_app) as port:
        yield port


async def read_to_close(reader: asyncio.StreamReader, within: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection; fails if it has not closed within `within` s."""
    data = b""
    try:
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                data += chunk
    except TimeoutError:
        raise AssertionError(f"the server did not close the connection within {within} s; it sent {data[:200]!r}") from None
    return data


async def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes; everything the server answers until it closes (which it must, within 5 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await read_to_close(reader)
    finally:
        writer.close()


def error_of(response: bytes) -> dict[str, Any]:
    return orjson.loads(response.split(b"\r\n\r\n", 1)[1])["error"]


def test_the_private_api_it_overrides_is_still_there() -> None:
    names = ("data_received", "connection_lost", "on_message_begin", "on_url", "on_header", "on_headers_complete", "on_message_complete")
    for name in names:
        assert callable(getattr(HttpToolsProtocol, name, None)), f"uvicorn no longer has HttpToolsProtocol.{name}"
    assert list(inspect.signature(HttpToolsProtocol.send_400_response).parameters) == ["self", "msg"]
    assert list(inspect.signature(HttpToolsProtocol.on_header).parameters) == ["self", "name", "value"]
    assert "server_state" in inspect.signature(HttpToolsProtocol.__init__).parameters


async def test_an_oversized_header_gets_431_in_openai_shape(port: int) -> None:
    big = b"x-big: " + b"a" * (LIMIT * 2) + b"\r\n"
    response = await exchange(port, b"GET / HTTP/1.1\r\nhost: t\r\n" + big + b"\r\n")
    assert response.startswith(b"HTTP/1.1 431 ")
    assert b"connection: close" in response.lower()
    assert error_of(response)["code"] == "request_header_fields_too_large"


async def test_an_endless_header_line_is_cut_off_too(port: int) -> None:
    # Never completed: httptools would buffer it forever without the byte count in data_received.
    response = await exchange(port, b"GET / HTTP/1.1\r\nx-endless: " + b"a" * (LIMIT * 4))
    assert response.startswith(b"HTTP/1.1 431 ")


async def test_a_malformed_request_gets_400_in_openai_shape(port: int) -> None:
    response = await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 400 ")
    assert error_of(response)["code"] == "invalid_http_request"


async def test_requests_within_the_limit_pass_on_a_kept_alive_connection(port: int) -> None:
    # Each head is under the limit, together they are over it: the count restarts per request.
    one = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nx-pad: " + b"a" * (LIMIT // 2) + b"\r\n\r\nbody"
    last = b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
    response = await exchange(port, one * 3 + last)
    assert response.count(b"HTTP/1.1 200 ") == 4


def unchunk(body: bytes) -> bytes:
    """A chunked body's payload; fails unless it is framed exactly (ending in the last chunk)."""
    out = b""
    while True:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        assert rest[n : n + 2] == b"\r\n", body
        out, body = out + rest[:n], rest[n + 2 :]
        if n == 0:
            assert body == b"", body
            return out


async def test_the_body_writer_streams_chunks_the_server_frames_and_ends() -> None:
    async with serving(writer_app) as port:
        request = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"
        close = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
        response = await exchange(port, request + close)
    first, second = response.split(b"HTTP/1.1 200 OK\r\n")[1:]  # both on one kept-alive connection
    for one in (first, second):
        head, body = one.split(b"\r\n\r\n", 1)
        assert b"transfer-encoding: chunked" in head
        # The last message went through `send`; a wrapped `send` was not given the writer.
        assert unchunk(body) == b"data: 1\n\ndata: 2\n\n"


async def test_a_request_offered_the_body_writer_is_freed_without_the_garbage_collector() -> None:
    # A reference cycle through the writer would leave every request to the collector (~10% of CPU).
    CYCLES.clear()
    gc.disable()
    try:
        async with serving(writer_app) as port:
            request = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
            for _ in range(3):
                assert (await exchange(port, request)).startswith(b"HTTP/1.1 200 ")
            async with asyncio.timeout(5):
                while any(ref() is not None for ref in CYCLES):
                    await asyncio.sleep(0.01)
        assert len(CYCLES) == 3
    finally:
        gc.enable()


def watching_app(stop_early: bool, seen: dict[str, Any]) -> Any:
    """Starts a stream, watches for the client leaving with the server's writer, then waits for it."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        gone = asyncio.Event()
        seen["receive_after_body"] = 0

        async def counted() -> Any:  # a watcher task would wait here
            seen["receive_after_body"] += 1
            return await receive()

        stop = watch_client(body_writer(scope, send), counted, gone.set)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        if stop_early:
            stop()
        seen["started"].set()
        try:
            async with asyncio.timeout(2):
                await gone.wait()
            seen["gone"] = True
        except TimeoutError:
            seen["gone"] = False
        stop()

    return app


@pytest.mark.parametrize("stop_early", [False, True])
async def test_the_server_tells_the_writer_when_the_client_leaves_mid_response(stop_early: bool) -> None:
    seen: dict[str, Any] = {"started": asyncio.Event()}
    async with serving(watching_app(stop_early, seen)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        await seen["started"].wait()
        writer.close()  # mid-stream: the response never completed
        async with asyncio.timeout(5):
            while "gone" not in seen:
                await asyncio.sleep(0.01)
    assert seen["gone"] is not stop_early  # heard at once, unless it had stopped watching
    assert seen["receive_after_body"] == 0  # no task waited on `receive` for it


async def test_without_the_servers_writer_a_task_watches_receive() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    gone = asyncio.Event()
    stop = watch_client(None, messages.get, gone.set)
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    await messages.put({"type": "http.disconnect"})
    async with asyncio.timeout(5):
        await gone.wait()
    stop()
    later = asyncio.Event()
    stop = watch_client(None, messages.get, later.set)
    stop()  # stopped before the client left: never told
    await messages.put({"type": "http.disconnect"})
    await asyncio.sleep(0)
    assert not later.is_set() and messages.qsize() == 1
