"""A cap on the connections one client address holds at once, applied as the server accepts them.

The counts are the whole gateway's: with several workers on one socket they live on the workers'
shared board (`gateway/pool/board.py`), which checks the cap and counts the connection under one
lock, so two workers never both admit a client's last allowed connection. A connection over the cap
is closed at once, before anything is read from it. A peer without an IP address (a Unix socket)
is not capped.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Protocol

Release = Callable[[], None]


class ClientCounts(Protocol):
    """Where the gateway counts each client address's open connections."""

    def admit_client(self, key: bytes, cap: int) -> Release | None:
        """Count one more connection of client `key` unless it holds `cap` already; what uncounts it,
        or None (refused)."""


def _uncounted() -> None:
    pass


class ClientCap:
    """At most `limit` connections per client address; `on_refused` is told of each one closed."""

    def __init__(self, counts: ClientCounts, limit: int, on_refused: Callable[[], None]) -> None:
        self._counts = counts
        self.limit = limit
        self._on_refused = on_refused

    def admit(self, peer: Any) -> Release | None:
        """Admit a connection from `peer` (the transport's `peername`): what releases it, or None (refused)."""
        key = client_key(peer)
        if key is None:
            return _uncounted
        release = self._counts.admit_client(key, self.limit)
        if release is None:
            self._on_refused()
        return release


_V4_MAPPED = bytes(10) + b"\xff\xff"


def client_key(peer: Any) -> bytes | None:
    """16 bytes naming a peer's IP address (IPv4 as its IPv4-mapped IPv6 form); None without one."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    host = peer[0].partition("%")[0]  # an IPv6 scope id names the interface, not the client
    try:
        return socket.inet_pton(socket.AF_INET6, host) if ":" in host else _V4_MAPPED + socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return None
