"""Every failure the upstream client raises, and what each tells the proxy to do.

`WireError` and its kinds are failures of an exchange with a backend: `ConnectFailed` (no response
byte came: safe to fail over), `BadResponse` (not HTTP), `BodyDropped` (the connection broke inside
the body). `LocalResourceError` and `local_kind` are the gateway's own resources running out
(descriptors, buffers, ephemeral ports, a pool that stayed full): no evidence against the backend,
so the request gets a 503 with Retry-After, the backend keeps its health and the request is not
failed over (every backend sits behind the same wall). `UPSTREAM_ERRORS` is what a small call
upstream may raise besides that.
"""

from __future__ import annotations

import errno

import aiohttp


class WireError(Exception):
    """A failure of an upstream exchange."""


class ConnectFailed(WireError):
    """No response byte came: refused, unreachable, reset, or closed before the status line."""


class BadResponse(WireError):
    """The backend answered with something that is not an HTTP/1.1 response."""


class BodyDropped(WireError):
    """The connection broke before the response body ended."""


class UpstreamStatusError(Exception):
    """A backend answered a management request with a non-200 status."""


class LocalResourceError(Exception):
    """The gateway ran out of something of its own (e.g. the connection pool stayed full)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# What a call upstream may raise besides the gateway's own `LocalResourceError`.
UPSTREAM_ERRORS = (WireError, aiohttp.ClientError, OSError, TimeoutError)

# errno -> metric kind
_LOCAL_ERRNOS = {
    errno.EMFILE: "emfile",
    errno.ENFILE: "enfile",
    errno.ENOBUFS: "enobufs",
    errno.ENOMEM: "enomem",
    errno.EADDRNOTAVAIL: "eaddrnotavail",
}


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
