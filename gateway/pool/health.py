"""Background health checking of the backends.

SGLang's `/ready` is cheap (no GPU work), so it is polled every second; `/health` runs a one-token
generation and takes at least a second, so it is polled rarely, and always for a backend that timed
out on real traffic (a hung server can still answer `/ready`). Requests that fail to connect
report it here at once, so routing does not wait for the next poll. Beside the probes, a ready
backend's own `/v1/loads` is fetched at the same cadence into `Backend.engine_load` (dropped when
it leaves READY, fetched once more as it turns READY), which the node's `/v1/loads` sums; a slow
answer there never delays a probe.

The rule for taking a backend out is evidence about the backend: a probe that cannot connect, a
refused or reset connection on real traffic that a probe run at once confirms, or
`max_consecutive_failures` such failures in a row; one passing probe puts it back. Failures of the
gateway's own resources (out of descriptors, ports, buffers; see `gateway.upstream.errors`) are no
evidence and leave the state as it is.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from gateway.config import HealthConfig
from gateway.pool.backends import Backend, Health, Pool
from gateway.pool.engine_load import EngineLoad, parse_engine_load
from gateway.upstream.client import UpstreamClient
from gateway.upstream.errors import UpstreamStatusError, local_kind

log = logging.getLogger("specgate.health")


class HealthChecker:
    """Polls every backend and keeps `Backend.health` true to what it sees."""

    def __init__(self, pool: Pool, upstreams: dict[str, UpstreamClient], config: HealthConfig, *, poll: bool = True) -> None:
        """`poll=False`: a worker of several, which probes only to confirm its own failures; the
        gateway's one polling checker (in the parent process) shares states through the pool's board."""
        self._poll = poll
        self._pool = pool
        self._upstreams = upstreams
        self._config = config
        self._tasks: list[asyncio.Task[None]] = []
        # One per backend from the start, so a report before `start` (or after `stop`) is still recorded.
        self._wake = {backend.name: asyncio.Event() for backend in pool}
        self._failures = {backend.name: 0 for backend in pool}  # refused/reset connections in a row
        self._confirming: dict[str, asyncio.Task[None]] = {}  # one confirming probe per backend at a time

    def start(self) -> None:
        """Start one polling task per backend."""
        if not self._poll:
            return
        for backend in self._pool:
            self._tasks.append(asyncio.create_task(self._watch(backend), name=f"health-{backend.name}"))
            self._tasks.append(asyncio.create_task(self._watch_load(backend), name=f"load-{backend.name}"))

    async def stop(self) -> None:
        """Stop polling."""
        tasks = [*self._tasks, *self._confirming.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._confirming.clear()

    def set_state(self, backend: Backend, health: Health, detail: str = "") -> None:
        """Record a state, logging transitions."""
        if backend.health is not health:
            if health is Health.READY:
                self._failures[backend.name] = 0
            log.info("backend %s: %s -> %s%s", backend.name, backend.health.value, health.value, f" ({detail})" if detail else "")
            backend.health = health
            self._pool.publish_health(backend)
            if health is not Health.READY and backend.engine_load is not None:
                backend.engine_load = None  # figures of a backend out of routing are stale
                self._pool.publish_loads()
        backend.health_detail = detail

    def report_unreachable(self, name: str, detail: str) -> None:
        """A request could not connect: stop routing there until a probe says it is back."""
        self.set_state(self._pool[name], Health.DOWN, detail)
        self._wake[name].set()

    async def confirm_unreachable(self, name: str, detail: str) -> bool:
        """A request found `name` refusing or resetting its connection; True when that takes it out.

        It is taken out when a /ready probe run now cannot connect either, or after
        `max_consecutive_failures` failures in a row (outlier detection); concurrent reports share
        one probe.
        """
        backend = self._pool[name]
        self._failures[name] += 1
        if self._failures[name] >= self._config.max_consecutive_failures:
            self.set_state(backend, Health.DOWN, f"{self._failures[name]} failed connections in a row ({detail})")
        elif backend.health is Health.READY:
            probe = self._confirming.get(name)
            if probe is None or probe.done():
                probe = asyncio.create_task(self._probe(backend, "/ready", self._config.ready_timeout))
                self._confirming[name] = probe
            await asyncio.shield(probe)
        self._wake[name].set()
        return not backend.available

    def report_success(self, name: str) -> None:
        """A request reached `name`: its run of failed connections is over."""
        self._failures[name] = 0

    def report_timeout(self, name: str, detail: str) -> None:
        """A request timed out waiting for the backend: only a passing /health clears this."""
        self.set_state(self._pool[name], Health.FAILING, detail)
        self._wake[name].set()

    async def _watch(self, backend: Backend) -> None:
        loop = asyncio.get_running_loop()
        next_health = loop.time()  # probe /health first, so a hung server is caught before traffic
        wake = self._wake[backend.name]
        while True:
            self._pool.sync()  # a worker may have seen it fail
            if backend.health is Health.FAILING or loop.time() >= next_health:
                await self._probe(backend, "/health", self._config.health_timeout)
                next_health = loop.time() + self._config.health_interval
            else:
                await self._probe(backend, "/ready", self._config.ready_timeout)
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), self._config.ready_interval)
            except TimeoutError:
                pass

    async def _probe(self, backend: Backend, path: str, timeout: float) -> None:
        upstream = self._upstreams[backend.name]
        try:
            status, _, _ = await upstream.get(path, timeout, auth=False)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            kind = local_kind(exc)
            if kind is not None:  # the gateway's own limit, not the backend: keep what we knew
                log.warning("backend %s: %s probe not sent, the gateway is out of %s", backend.name, path, kind)
            elif isinstance(exc, TimeoutError):
                if backend.health is not Health.FAILING:
                    self.set_state(backend, Health.UNREADY, f"{path} timed out")
            else:
                self.set_state(backend, Health.DOWN, f"{path}: {type(exc).__name__}")
            return
        if status != 200:
            if backend.health is not Health.FAILING:
                self.set_state(backend, Health.UNREADY, f"{path} answered {status}")
            return
        if backend.health is Health.FAILING and path != "/health":
            return
        if backend.model_card is None and not await self._discover(backend, upstream):
            return
        if backend.health is not Health.READY:
            # Its KV capacity before any request is routed to it (the policy fits long requests by it),
            # shared before its state is.
            backend.engine_load = await self._engine_load(backend)
            self._pool.publish_loads()
        self.set_state(backend, Health.READY)

    async def _watch_load(self, backend: Backend) -> None:
        """Keep a ready backend's own /v1/loads, fetched every `ready_interval`."""
        while True:
            if backend.available:
                load = await self._engine_load(backend)
                backend.engine_load = load if backend.available else None
                self._pool.publish_loads()
            await asyncio.sleep(self._config.ready_interval)

    async def _engine_load(self, backend: Backend) -> EngineLoad | None:
        """The backend's own /v1/loads; None when it serves none (an older SGLang) or did not answer."""
        try:
            body = await self._upstreams[backend.name].get_json("/v1/loads", self._config.ready_timeout)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, UpstreamStatusError) as exc:
            log.debug("backend %s: no /v1/loads (%s)", backend.name, type(exc).__name__)
            return None
        return parse_engine_load(body)

    async def _discover(self, backend: Backend, upstream: UpstreamClient) -> bool:
        """Learn the served model name and card from /v1/models before the first request."""
        try:
            listing = await upstream.get_json("/v1/models", self._config.ready_timeout)
            cards = listing["data"]
        except (aiohttp.ClientError, OSError, TimeoutError, KeyError, TypeError, ValueError) as exc:
            self.set_state(backend, Health.UNREADY, f"/v1/models failed: {type(exc).__name__}")
            return False
        card = next((c for c in cards if c.get("id") == backend.served_model_name), cards[0] if cards else None)
        if card is None:
            self.set_state(backend, Health.UNREADY, "/v1/models lists no model")
            return False
        backend.model_card = card
        backend.served_model_name = backend.served_model_name or card["id"]
        self._pool.publish_cards()
        return True
