"""A server extension: write a streamed response's body chunks synchronously, without ASGI's `send`.

The streaming relay runs in the upstream connection's read callback (`relay/sse.py`), where nothing
can be awaited. The gateway's own server protocol (`http_protocol.py`) offers a `BodyWriter` for
each request in `scope["extensions"]`; `body_writer` hands it to the app only when the app's `send`
is that server's own, so no middleware that wraps `send` (and might look at or change the body) is
bypassed. Under any other ASGI server the relay awaits `send`. What it saves per chunk:
docs/benchmarks/design-notes.md#the-body-writer.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from starlette.types import Scope, Send

EXTENSION = "specgate.body_writer"


class BodyWriter:
    """One request's response body, written chunk by chunk straight to the client's transport.

    For a response already started with chunked transfer encoding (a stream: no content-length);
    the last, empty body message still goes through `send`, which completes the response.
    """

    __slots__ = ("_cycle", "transport", "flow", "_on_gone")

    def __init__(self, cycle: Any) -> None:  # uvicorn's RequestResponseCycle (httptools)
        # The cycle holds the scope, which holds this writer: a strong reference back made every
        # request's cycle garbage only the collector frees (docs/benchmarks/design-notes.md#the-garbage-collector).
        self._cycle = weakref.ref(cycle)
        # The connection's transport and flow control (they outlive the request), public for the
        # relay's C sink (relay/_sse.c), which writes as `write` does.
        self.transport = cycle.transport
        self.flow = cycle.flow
        self._on_gone: Callable[[], None] | None = None

    def serves(self, send: Send) -> bool:
        """True when `send` is this request's own, unwrapped server `send`."""
        cycle = self._cycle()
        return cycle is not None and send == cycle.send

    def on_client_gone(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` once if the client leaves before the response completes (at once if it
        already has); None stops watching (`client_watch.py`)."""
        cycle = self._cycle()
        if callback is not None and (cycle is None or cycle.disconnected):
            callback()
            return
        self._on_gone = callback

    def client_gone(self) -> None:
        """The server lost the client's connection before the response completed."""
        callback, self._on_gone = self._on_gone, None
        if callback is not None:
            callback()

    def write(self, body: bytes) -> bool:
        """Send one chunk; a client that has left is not written to, as `send` does.

        Returns `paused` after the write (the relay asks once per chunk: a property call less).
        """
        if body and not self.transport.is_closing():  # an empty chunk would end the response
            self.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return bool(self.flow.write_paused)

    @property
    def paused(self) -> bool:
        """The client's socket buffer is full: write no more until `drain` returns.

        uvicorn resumes writing when the client leaves, so a gone client never reads as paused.
        """
        return bool(self.flow.write_paused)

    async def drain(self) -> None:
        """Wait until the client can take more (returns at once when it has left)."""
        await self.flow.drain()


def offer(scope: Scope, cycle: Any) -> None:
    """Offer the request's `BodyWriter` to the app (called by the server protocol)."""
    scope.setdefault("extensions", {})[EXTENSION] = BodyWriter(cycle)


def client_gone(scope: Scope) -> None:
    """Tell the request's writer, if it has one, that its client left (called by the server protocol)."""
    writer = scope.get("extensions", {}).get(EXTENSION)
    if writer is not None:
        writer.client_gone()


def body_writer(scope: Scope, send: Send) -> BodyWriter | None:
    """The request's `BodyWriter` when the server offers one and `send` is the server's own."""
    writer = scope.get("extensions", {}).get(EXTENSION)
    return writer if writer is not None and writer.serves(send) else None
