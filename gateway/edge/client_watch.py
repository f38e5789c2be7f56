"""Knowing when a request's client leaves before its response completed, so the exchange can stop.

Under the gateway's own server protocol the request's body writer hears it from the server's
`connection_lost` (`http_protocol.py`). Under any other ASGI server, or behind a middleware that
wraps `send`, a task waits on `receive` for `http.disconnect` (what that task costs:
docs/benchmarks/design-notes.md#hearing-a-client-leave).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive

from gateway.edge.body_writer import BodyWriter


def watch_client(writer: BodyWriter | None, receive: Receive, on_gone: Callable[[], None]) -> Callable[[], None]:
    """Call `on_gone` once if the client leaves (at once if it already has); returns what stops watching.

    Stop watching when the response is done: `on_gone` usually refers to the response, which
    refers to the writer, a cycle that would otherwise wait for the garbage collector.
    """
    if writer is not None:
        writer.on_client_gone(on_gone)
        return lambda: writer.on_client_gone(None)
    return asyncio.create_task(_wait_for_disconnect(receive, on_gone)).cancel


async def _wait_for_disconnect(receive: Receive, on_gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    on_gone()
