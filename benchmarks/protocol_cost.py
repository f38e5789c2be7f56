"""The gateway's HTTP protocol alone: CPU per connection and per kept-alive request, under a trivial app.

Run with a checkout's own Python (benchmarks/connection_ab.py runs it with each), it measures that
checkout's `gateway.edge.http_protocol.GatewayHttpProtocol` on uvloop, with a transport that takes
the writes and an app that answers at once, so only the protocol's own work differs between two
checkouts; the rest (the event loop, uvicorn's request cycle, the app) is the same in both. Prints
one JSON line: microseconds of process CPU per connection (accepted, one request, closed) and per
request on one kept-alive connection.

    python benchmarks/protocol_cost.py [--connections 20000] [--requests 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import time
from typing import Any

import uvicorn
import uvloop
from uvicorn.server import ServerState

from gateway.edge import http_protocol

_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
KEPT, CLOSING = _HEAD + b"\r\n{}", _HEAD + b"connection: close\r\n\r\n{}"
_EXTRA = {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}


class _Transport(asyncio.Transport):
    """Takes writes; closing tells the protocol the connection is lost on the next loop pass."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.protocol: Any = None
        self._closing = False

    def write(self, data: Any) -> None:
        pass

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return _EXTRA.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _App:
    """Answers each request at once and says when the answer is sent."""

    def __init__(self) -> None:
        self.answered = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        self.answered.set()


def _factory(app: _App) -> Any:
    """This checkout's protocol with the gateway's defaults (whatever its constructor takes)."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, timeout_keep_alive=30)
    config.load()
    state = ServerState()
    options: dict[str, Any] = {"max_head_bytes": 65536}
    if "limits" in inspect.signature(http_protocol.GatewayHttpProtocol.__init__).parameters:
        options = {"limits": http_protocol.ConnectionLimits(65536)}  # type: ignore[attr-defined]
    return lambda: http_protocol.GatewayHttpProtocol(config=config, server_state=state, app_state={}, **options)


async def _measure(connections: int, requests: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    app = _App()
    make = _factory(app)

    async def one_connection(request: bytes, count: int) -> None:
        transport = _Transport(loop)
        protocol = transport.protocol = make()
        protocol.connection_made(transport)
        for _ in range(count):
            app.answered.clear()
            protocol.data_received(request)
            await app.answered.wait()
        transport.close()
        await asyncio.sleep(0)

    for _ in range(2000):  # warm
        await one_connection(CLOSING, 1)
    started = time.process_time()
    for _ in range(connections):
        await one_connection(CLOSING, 1)
    per_connection = (time.process_time() - started) / connections
    started = time.process_time()
    await one_connection(KEPT, requests)
    per_request = (time.process_time() - started) / requests
    return {"per_connection_us": per_connection * 1e6, "per_request_us": per_request * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=50000)
    args = parser.parse_args()
    print(json.dumps(uvloop.run(_measure(args.connections, args.requests))))


if __name__ == "__main__":
    main()
