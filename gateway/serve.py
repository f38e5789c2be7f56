"""`specgate serve`: start (or find) the backends, serve the gateway, and shut down cleanly.

Shutdown order on SIGTERM or Ctrl-C: stop admitting (new requests get 503 and /ready turns 503),
let in-flight requests finish for up to `server.drain_timeout`, stop the HTTP server, then stop
the backends this process started. A second signal skips the drain. With `server.workers` > 1 the
HTTP server runs in that many worker processes on the socket bound here (gateway/workers.py), each
draining its own requests, and this process keeps the backends and the health checks.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import click
import uvloop
from pydantic import ValidationError

from backends.fdlimit import raise_nofile_limit
from backends.plan import build_plan
from backends.resolve import PlanError
from backends.supervisor import Supervisor, SupervisorError
from gateway.config import BackendConfig, Settings, load_settings
from gateway.edge.descriptors import DescriptorBudget, inflight_cap_warning, plan_budget
from gateway.metrics import GatewayMetrics
from gateway.policies.factory import make_policy
from gateway.relay import sse as relay
from gateway.runtime import Runtime
from gateway.http_server import Lifecycle, Stopped, announce, serve_http
from gateway.workers import serve_workers

log = logging.getLogger("specgate")


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
    if relay.TokenSink is None:
        log.warning("gateway.relay._sse is not built (no C compiler at install): the relay checks each event in Python, at more CPU a chunk")
    lifecycle = Lifecycle()
    lifecycle.install()
    policy = make_policy(settings.resolved_policy)
    workers = settings.resolved_workers
    # Several workers: every process's counters go to files there, summed at each scrape.
    backends = settings.grouped_backends
    supervisor: Supervisor | None = None
    sock = _bind(settings.server.host, settings.server.port)
    metrics_dir = tempfile.mkdtemp(prefix="specgate-metrics-") if workers > 1 else None
    metrics = GatewayMetrics(metrics_dir)
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
        wait = supervisor is not None
        if workers > 1:
            assert metrics_dir is not None
            await serve_workers(settings, backends, sock, lifecycle, budget, metrics, metrics_dir, count=workers, wait_for_backends=wait)
        else:
            runtime = Runtime(settings, backends, policy, metrics, budget)
            await serve_http(settings, runtime, sock, lifecycle, on_listening=lambda: announce(runtime, sock, wait))
    except Stopped:
        log.info("stopped during startup")
    finally:
        sock.close()
        if supervisor is not None:
            await supervisor.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _overrides(host: str | None, port: int | None, policy: str | None, threshold: int | None, eagle_max_inflight: int | None,
               log_level: str | None, workers: int | None = None) -> dict[str, Any]:
    pairs = (("host", host), ("port", port), ("log_level", log_level), ("workers", workers))
    server: dict[str, Any] = {k: v for k, v in pairs if v is not None}
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
@click.option("--workers", type=click.IntRange(1, 64), help="worker processes (default: one per core, at most 8)")
def serve_command(config_path: Path | None, host: str | None, port: int | None, policy: str | None,
                  threshold: int | None, eagle_max_inflight: int | None, log_level: str | None, workers: int | None) -> None:
    """Serve the OpenAI-compatible gateway in front of EAGLE-3 and plain SGLang servers."""
    try:
        settings = load_settings(config_path, **_overrides(host, port, policy, threshold, eagle_max_inflight, log_level, workers))
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
