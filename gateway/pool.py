"""The backend pool: each backend's health state and its exact in-flight count.

The in-flight count is the routing signal, so it must be exact: a `Slot` is taken when a request
is routed and released exactly once when its response ends, on every path (finished, error,
timeout, client gone). Like SMG's guard objects, the slot is tied to the response's lifetime by
`try/finally` in the code that owns the response body, never by bookkeeping spread around.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field


class Health(enum.Enum):
    """What the gateway believes about a backend; only READY receives traffic."""

    STARTING = "starting"  # never seen ready yet
    READY = "ready"
    UNREADY = "unready"  # answers 503: warming up, draining or unhealthy
    DOWN = "down"  # connection refused or reset
    FAILING = "failing"  # timed out on real traffic; only a passing /health brings it back


@dataclass(frozen=True)
class BackendView:
    """One backend as a policy sees it."""

    name: str
    speculative: bool
    available: bool
    inflight: int


@dataclass(frozen=True)
class PoolSnapshot:
    """An immutable picture of the pool at one instant; policies are functions of it."""

    backends: tuple[BackendView, ...]

    @property
    def total_inflight(self) -> int:
        return sum(b.inflight for b in self.backends)

    def get(self, name: str) -> BackendView:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def speculative(self) -> BackendView:
        return next(b for b in self.backends if b.speculative)

    @property
    def plain(self) -> BackendView:
        return next(b for b in self.backends if not b.speculative)


@dataclass
class Backend:
    """Mutable state of one backend; owned by the pool, changed only through it and the health checker."""

    name: str
    url: str
    speculative: bool
    served_model_name: str | None = None
    model_card: dict[str, object] | None = None
    health: Health = Health.STARTING
    health_detail: str = ""
    inflight: int = 0
    served: int = 0
    # Integral of `inflight` over time, so a request can learn the mean load it ran under in O(1).
    _load_area: float = 0.0
    _load_since: float = field(default_factory=time.monotonic)

    @property
    def available(self) -> bool:
        return self.health is Health.READY

    def load_area(self, now: float) -> float:
        """Integral of the in-flight count from process start to `now` (request-seconds)."""
        return self._load_area + self.inflight * (now - self._load_since)

    def _change(self, delta: int) -> None:
        now = time.monotonic()
        self._load_area = self.load_area(now)
        self._load_since = now
        self.inflight += delta


class Slot:
    """One routed request's hold on a backend; `release()` is idempotent."""

    __slots__ = ("backend", "_pool", "_released", "acquired_at")

    def __init__(self, pool: Pool, backend: Backend) -> None:
        self._pool = pool
        self.backend = backend
        self._released = False
        self.acquired_at = time.monotonic()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Give the slot back; later calls do nothing."""
        if self._released:
            return
        self._released = True
        self._pool._release(self.backend)


class Pool:
    """All backends, their health and in-flight counts."""

    def __init__(self, backends: list[Backend]) -> None:
        self._backends = {b.name: b for b in backends}
        self._idle = asyncio.Event()
        self._idle.set()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._backends.values())

    def __getitem__(self, name: str) -> Backend:
        return self._backends[name]

    def __contains__(self, name: str) -> bool:
        return name in self._backends

    @property
    def names(self) -> list[str]:
        return list(self._backends)

    @property
    def total_inflight(self) -> int:
        return sum(b.inflight for b in self._backends.values())

    def load_area(self, now: float) -> float:
        """Integral of the total in-flight count from process start to `now` (request-seconds)."""
        return sum(b.load_area(now) for b in self._backends.values())

    def snapshot(self) -> PoolSnapshot:
        """The current state as plain data for a policy."""
        return PoolSnapshot(
            tuple(BackendView(b.name, b.speculative, b.available, b.inflight) for b in self._backends.values())
        )

    def acquire(self, name: str) -> Slot:
        """Take an in-flight slot on backend `name`."""
        backend = self._backends[name]
        backend._change(+1)
        backend.served += 1
        self._idle.clear()
        return Slot(self, backend)

    def _release(self, backend: Backend) -> None:
        backend._change(-1)
        if self.total_inflight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
