"""Telling the gateway's own resource failures from the backend's.

A connect that fails because this process is out of descriptors, buffers or ephemeral ports, or
because the connection pool stayed full for the whole connect timeout, says nothing about the
backend: the request gets a 503 with Retry-After, the backend keeps its health state, and the
request is not failed over (the other backend sits behind the same wall).
"""

from __future__ import annotations

import errno

# errno -> metric kind
_LOCAL_ERRNOS = {
    errno.EMFILE: "emfile",
    errno.ENFILE: "enfile",
    errno.ENOBUFS: "enobufs",
    errno.ENOMEM: "enomem",
    errno.EADDRNOTAVAIL: "eaddrnotavail",
}


class LocalResourceError(Exception):
    """The gateway ran out of something of its own (e.g. the connection pool stayed full)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def local_kind(exc: BaseException) -> str | None:
    """The kind of local resource `exc` (or an exception it wraps) ran out of; None for anything else."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, LocalResourceError):
            return current.kind
        if isinstance(current, OSError) and current.errno in _LOCAL_ERRNOS:
            return _LOCAL_ERRNOS[current.errno]
        current = current.__cause__ or current.__context__
    return None
