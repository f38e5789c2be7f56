"""The uvicorn server both specgate processes run: the gateway and the simulator.

Each owns its signals (the gateway drains before it stops; the simulator stops all its ports at
once), so uvicorn must install no handlers of its own; and each needs to know when it listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn


class UvicornServer(uvicorn.Server):
    """uvicorn, minus its own signal handling, plus a `listening` event set once it serves."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing: the process handles its signals itself."""
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then `listening` is set if it succeeded."""
        await super().startup(sockets)
        if self.started:
            self.listening.set()
