"""`specgate serve`: start (or find) the backends, serve the gateway, and shut down cleanly.

Shutdown order on SIGTERM or Ctrl-C: stop admitting (new requests get 503 and /ready turns 503),
let in-flight requests finish for up to `server.drain_timeout`, stop the HTTP server, then stop
the backends this process started. A second signal skips the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import sys
import tomllib
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import click
import uvicorn
import uvloop
from pydantic import ValidationError

from backends.fdlimit import raise_nofile_limit
from backends.plan import build_plan
from backends.resolve import PlanError
from backends.supervisor import Supervisor, SupervisorError
from backends.uvicorn_server import UvicornServer as _Server
from gateway.app import create_app
from gateway.config import BackendConfig, Settings, load_settings
from gateway.fdbudget import DescriptorBudget, inflight_cap_warning, plan_budget
from gateway.http_protocol import GatewayHttpProtocol
from gateway.metrics import GatewayMetrics
from gateway.policies import make_policy
from gateway.runtime import Runtime

log = logging.getLogger("specgate")

T = TypeVar("T")


class _Stopped(Exception):
    """A stop signal arrived before startup finished."""


class _Lifecycle:
    """Turns SIGINT/SIGTERM into events: the first asks for a graceful stop, the second forces it."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.force = asyncio.Event()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
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
            raise _Stopped
        return task.result()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


def _descriptor_budget(settings: Settings) -> DescriptorBudget:
    """Raise the open-file limit to the hard limit, say what it got, and warn when it caps max_inflight."""
    limit = raise_nofile_limit()
    budget = plan_budget(limit, settings.limits.fd_reserve)
    log.info(
        "open-file limit %d (was %d, hard %s): up to %d requests in flight",
        limit.soft, limit.soft_before, "unlimited" if limit.hard < 0 else limit.hard, budget.capacity,
    )
    warning = inflight_cap_warning(budget.soft_limit, settings.limits.fd_reserve, settings.limits.max_inflight)
    if warning is not None:
        log.warning("%s", warning)
    return budget


async def run(settings: Settings) -> None:
    """Run the gateway until a stop signal; every process started here is stopped before returning."""
    budget = _descriptor_budget(settings)  # before any socket, and before the backends inherit it
    lifecycle = _Lifecycle()
    lifecycle.install()
    policy = make_policy(settings.resolved_policy)
    metrics = GatewayMetrics()
    backends = settings.grouped_backends
    supervisor: Supervisor | None = None
    sock = _bind(settings.server.host, settings.server.port)
    try:
        if settings.launches_backends:
            launch = settings.planned_launch
            plan = build_plan(launch, eagle_cap=settings.resolved_policy.eagle_cap)
            for warning in plan.warnings:
                log.warning("launch plan: %s", warning)
            backend_key = launch.backend_api_key.get_secret_value() if launch.backend_api_key else None
            supervisor = Supervisor(
                plan,
                startup_timeout=launch.startup_timeout,
                backoff_initial=launch.restart_backoff_initial,
                backoff_max=launch.restart_backoff_max,
                stop_timeout=launch.stop_timeout,
                on_restart=lambda name: metrics.restarts.labels(name).inc(),
                api_key=backend_key,
            )
            backends = [
                BackendConfig(
                    name=ep.backend,
                    url=ep.url,
                    speculative=ep.speculative,
                    api_key=backend_key,
                    served_model_name=ep.served_model_name,
                    group=ep.group,
                )
                for process in plan.processes
                for ep in process.endpoints
            ]
            await lifecycle.unless_stopped(supervisor.start())
        runtime = Runtime(settings, backends, policy, metrics, budget)
        await _serve(settings, runtime, sock, lifecycle, wait_for_backends=supervisor is not None)
    except _Stopped:
        log.info("stopped during startup")
    finally:
        sock.close()
        if supervisor is not None:
            await supervisor.stop()


async def _serve(settings: Settings, runtime: Runtime, sock: socket.socket, lifecycle: _Lifecycle, *, wait_for_backends: bool) -> None:
    server = _Server(
        uvicorn.Config(
            create_app(runtime),
            log_config=None,
            access_log=False,
            http=functools.partial(GatewayHttpProtocol, max_head_bytes=settings.limits.max_header_bytes),
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
        )
    )
    runtime.client_connections = server.server_state.connections  # the descriptor budget counts them
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await lifecycle.unless_stopped(_announce(server, runtime, sock, wait_for_backends))
        await lifecycle.unless_stopped(asyncio.shield(serving))
    except _Stopped:
        runtime.draining = True
        drain = asyncio.create_task(runtime.pool.wait_idle(settings.server.drain_timeout))
        force = asyncio.create_task(lifecycle.force.wait())
        await asyncio.wait((drain, force), return_when=asyncio.FIRST_COMPLETED)
        force.cancel()
        if not drain.done() or not drain.result():
            drain.cancel()
            log.warning("stopping with %d request(s) still in flight", runtime.pool.total_inflight)
            runtime.interrupt_requests()
            await runtime.pool.wait_idle(1.0)
        server.should_exit = True
    await serving


async def _announce(server: _Server, runtime: Runtime, sock: socket.socket, wait_for_backends: bool) -> None:
    """Print the one 'serving on' line once the gateway can take requests."""
    await server.listening.wait()
    if wait_for_backends:  # we started them and they reported ready; let the health checker agree
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while not all(b.available for b in runtime.pool):
                    await asyncio.sleep(0.05)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    backends = ", ".join(f"{b.name}={b.url} ({b.health.value})" for b in runtime.pool)
    click.echo(f"specgate serving on http://{shown}:{port}  policy={runtime.policy.name}  backends: {backends}")
    sys.stdout.flush()


def _overrides(host: str | None, port: int | None, policy: str | None, threshold: int | None, eagle_max_inflight: int | None, log_level: str | None) -> dict[str, Any]:
    server: dict[str, Any] = {k: v for k, v in (("host", host), ("port", port), ("log_level", log_level)) if v is not None}
    policy_section: dict[str, Any] = {
        k: v for k, v in (("name", policy), ("threshold", threshold), ("eagle_max_inflight", eagle_max_inflight)) if v is not None
    }
    return {k: v for k, v in (("server", server), ("policy", policy_section)) if v}


@click.command("serve")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), envvar="SPECGATE_CONFIG",
              help="TOML config; without one, two simulated backends are started (field-8gpu profile).")
@click.option("--host", help="listen address (default 127.0.0.1)")
@click.option("--port", type=int, help="listen port (default 8000; 0 picks a free one)")
@click.option("--policy", type=click.Choice(["threshold", "spill", "adaptive"]), help="routing policy")
@click.option("--threshold", type=int, help="threshold policy: EAGLE while total in-flight is below this")
@click.option("--eagle-max-inflight", type=int, help="spill policy: EAGLE while its own in-flight is below this")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
def serve_command(config_path: Path | None, host: str | None, port: int | None, policy: str | None,
                  threshold: int | None, eagle_max_inflight: int | None, log_level: str | None) -> None:
    """Serve the OpenAI-compatible gateway in front of an EAGLE-3 and a plain SGLang server."""
    try:
        settings = load_settings(config_path, **_overrides(host, port, policy, threshold, eagle_max_inflight, log_level))
    except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError, ValueError) as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from exc
    logging.basicConfig(
        level=settings.server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(settings))
    except PlanError as exc:
        raise click.ClickException(f"invalid launch plan: {exc}") from exc
    except SupervisorError as exc:
        raise click.ClickException(f"backends failed to start: {exc}") from exc
