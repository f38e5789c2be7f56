"""One process's HTTP server: signals turned into a graceful stop, uvicorn on a bound socket, the drain.

`specgate serve` runs it in its one process, or in each worker with `[server] workers` > 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import uvicorn

from backends.uvicorn_server import UvicornServer as _Server
from gateway.app import create_app
from gateway.config import Settings
from gateway.edge.client_cap import ClientCap
from gateway.edge.http_protocol import ConnectionLimits, GatewayHttpProtocol
from gateway.runtime import Runtime

log = logging.getLogger("specgate")

T = TypeVar("T")
_YOUNG_OBJECTS = 100_000  # the collector's first threshold: above the objects ~1,000 requests in flight hold


class Stopped(Exception):
    """A stop signal arrived before startup finished."""


class Lifecycle:
    """Turns SIGINT/SIGTERM into events: the first asks for a graceful stop, the second forces it."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self._signals = signals

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        if self.stop.is_set():
            log.warning("second %s: stopping now", signal.Signals(sig).name)
            self.force.set()
        else:
            log.info("%s: draining, then stopping", signal.Signals(sig).name)
            self.stop.set()

    async def unless_stopped(self, work: Awaitable[T]) -> T:
        """Await `work`, abandoning it if a stop signal comes first."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait((task, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise Stopped
        return task.result()


async def serve_http(
    settings: Settings,
    runtime: Runtime,
    sock: socket.socket,
    lifecycle: Lifecycle,
    *,
    on_listening: Callable[[], Awaitable[None]],
) -> None:
    """Serve the gateway's app on `sock` until a stop signal, then drain this process's requests."""
    server = _Server(
        uvicorn.Config(
            create_app(runtime),
            log_config=None,
            access_log=False,
            http=functools.partial(GatewayHttpProtocol, limits=connection_limits(runtime)),
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
            proxy_headers=False,  # no use for X-Forwarded-For, and its middleware runs per request
        )
    )
    runtime.client_connections = server.server_state.connections  # the descriptor budget counts them
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await lifecycle.unless_stopped(server.listening.wait())
        # Everything built so far (modules, the app, pydantic models) lives as long as the process:
        # kept out of the collector, full collections no longer re-scan it.
        gc.collect()
        gc.freeze()
        # The default young generation (700 objects) is smaller than what in-flight requests hold, so
        # it was collected over and over; above that working set nearly every object is freed by
        # reference counting first (docs/benchmarks/design-notes.md#the-garbage-collector).
        gc.set_threshold(_YOUNG_OBJECTS)
        await lifecycle.unless_stopped(on_listening())
        await lifecycle.unless_stopped(asyncio.shield(serving))
    except Stopped:
        runtime.draining = True
        # Every worker serves until the whole gateway is idle: one that stopped with its own requests
        # done would reset the connections it had just accepted, where a draining worker answers 503.
        drain = asyncio.create_task(runtime.pool.wait_gateway_idle(settings.server.drain_timeout))
        force = asyncio.create_task(lifecycle.force.wait())
        await asyncio.wait((drain, force), return_when=asyncio.FIRST_COMPLETED)
        force.cancel()
        if not drain.done() or not drain.result():
            drain.cancel()
            if runtime.pool.own_inflight:
                log.warning("stopping with %d request(s) still in flight", runtime.pool.own_inflight)
                runtime.interrupt_requests()
                await runtime.pool.wait_idle(1.0)
        server.should_exit = True
    await serving


def connection_limits(runtime: Runtime) -> ConnectionLimits:
    """What `[limits]` allows each client connection, counted in the runtime's metrics and board."""
    limits, metrics = runtime.settings.limits, runtime.metrics
    per_client = limits.max_connections_per_client
    return ConnectionLimits(
        max_head_bytes=limits.max_header_bytes,
        header_timeout=limits.client_header_timeout_seconds,
        body_timeout=limits.client_body_timeout_seconds,
        cap=ClientCap(runtime.pool.board, per_client, metrics.client_connections_refused.inc) if per_client else None,
        on_timeout=lambda phase: metrics.client_timeouts.labels(phase).inc(),
    )


async def announce(runtime: Runtime, sock: socket.socket, wait_for_backends: bool, extra: str = "") -> None:
    """Print the one 'serving on' line (the gateway listens); `wait_for_backends`: once they are ready."""
    if wait_for_backends:  # we started them and they reported ready; let the health checker agree
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while not all(b.available for b in runtime.pool):
                    await asyncio.sleep(0.05)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    backends = ", ".join(f"{b.name}={b.url} ({b.health.value})" for b in runtime.pool)
    click.echo(f"specgate serving on http://{shown}:{port}  policy={runtime.policy.name}  backends: {backends}{extra}")
    sys.stdout.flush()


