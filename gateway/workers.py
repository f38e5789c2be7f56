"""`[server] workers` > 1: worker processes sharing one listening socket, and the parent that keeps them.

The parent binds the socket, starts the backends, runs the gateway's one health checker and owns
the load board (gateway/pool/board.py); each worker (a spawned process) serves HTTP on the inherited
socket with its own runtime attached to the board, so routing sees the whole gateway's load and
every worker's policy learns from every completion. The parent replaces a worker that dies
(clearing its board row first) and, on SIGTERM or Ctrl-C, marks the gateway draining and passes
SIGTERM on: each worker drains its own requests; a second signal is passed on too (stop now).
Metrics use prometheus_client's multiprocess mode, so any worker's /metrics covers all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event

import uvloop

from gateway.config import BackendConfig, Settings
from gateway.edge.descriptors import DescriptorBudget, current_budget
from gateway.metrics import GatewayMetrics
from gateway.policies.factory import make_policy
from gateway.pool.board import BoardSpec, LoadBoard
from gateway.runtime import Runtime
from gateway.http_server import Lifecycle, Stopped, announce, serve_http

log = logging.getLogger("specgate.workers")

_POLL = 0.1  # seconds between checks of the workers' liveness
_PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class WorkerJob:
    """Everything a worker process needs (picklable: it crosses a spawn)."""

    settings: dict[str, Any]  # Settings.model_dump(): a settings class made from a file does not pickle
    backends: list[BackendConfig]
    sock: socket.socket
    board: BoardSpec
    index: int
    listening: Event
    metrics_dir: str


def worker_main(job: WorkerJob) -> None:
    """Entry point of a worker process: serve until SIGTERM, then drain."""
    logging.basicConfig(
        level=job.settings["server"]["log_level"].upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[w{job.index}]: %(message)s",
        stream=sys.stderr,
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which passes SIGTERM on
    _die_with_parent()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_worker(job))


async def _worker(job: WorkerJob) -> None:
    lifecycle = Lifecycle(signals=(signal.SIGTERM,))
    lifecycle.install()
    board = LoadBoard(job.board, job.index)
    settings = Settings.model_validate(job.settings)
    metrics = GatewayMetrics(job.metrics_dir)
    budget = current_budget(settings.limits.fd_reserve)
    runtime = Runtime(
        settings, job.backends, make_policy(settings.resolved_policy), metrics, budget, board=board, poll_health=False
    )

    async def listening() -> None:
        job.listening.set()

    try:
        await serve_http(settings, runtime, job.sock, lifecycle, on_listening=listening)
    finally:
        board.close()


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this worker when the parent dies, even by SIGKILL (Linux only)."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request was in place
        os._exit(1)


class WorkerSet:
    """The parent's side: starts `count` workers, replaces those that die, drains them all on stop."""

    def __init__(
        self, settings: Settings, backends: list[BackendConfig], sock: socket.socket, count: int, metrics_dir: str
    ) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._settings = settings
        self._backends = backends
        self._sock = sock
        self._metrics_dir = metrics_dir
        self.board = LoadBoard.create(count, len(backends), len(settings.security.tenants))
        self._procs: list[SpawnProcess | None] = [None] * count
        self._listening: list[Event] = [self._ctx.Event() for _ in range(count)]
        self.replaced = 0

    def _start(self, index: int) -> None:
        self._listening[index] = self._ctx.Event()
        job = WorkerJob(
            self._settings.model_dump(), self._backends, self._sock, self.board.spec, index, self._listening[index], self._metrics_dir
        )
        proc = self._ctx.Process(target=worker_main, args=(job,), name=f"specgate-worker-{index}", daemon=False)
        proc.start()
        self._procs[index] = proc

    def start(self) -> None:
        for index in range(len(self._procs)):
            self._start(index)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None and p.pid is not None]

    async def listening(self) -> None:
        """Wait until every worker serves."""
        while not all(event.is_set() for event in self._listening):
            self._check()
            await asyncio.sleep(0.02)

    def _check(self) -> None:
        """Replace each worker that exited: its counts are cleared before the new one starts."""
        for index, proc in enumerate(self._procs):
            if proc is not None and not proc.is_alive():
                log.warning("worker %d (pid %s) exited with %s: replacing it", index, proc.pid, proc.exitcode)
                proc.close()
                self.board.clear_worker(index, time.monotonic())
                self.replaced += 1
                self._start(index)

    async def keep(self, stop: asyncio.Event) -> None:
        """Replace dead workers until `stop` is set."""
        while not stop.is_set():
            self._check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _POLL)

    def signal_all(self, sig: int) -> None:
        for proc in self._procs:
            if proc is not None and proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    async def drain(self, timeout: float, force: asyncio.Event) -> None:
        """SIGTERM every worker and wait for all to exit; `force` (a second signal) passes SIGTERM again."""
        self.board.draining = True
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + timeout + 5.0  # each worker gives up on its drain itself
        forced = False
        while any(p is not None and p.is_alive() for p in self._procs):
            if force.is_set() and not forced:
                forced = True
                self.signal_all(signal.SIGTERM)
            if time.monotonic() > deadline:
                log.warning("workers still running after the drain: killing them")
                self.signal_all(signal.SIGKILL)
                deadline = float("inf")
            await asyncio.sleep(0.05)
        self.kill()  # all have exited: this only reaps them

    def kill(self) -> None:
        """Stop every worker still running at once."""
        self.signal_all(signal.SIGKILL)
        for proc in self._procs:
            if proc is not None:
                proc.join()
                proc.close()
        self._procs = [None] * len(self._procs)

    def close(self) -> None:
        self.board.close(unlink=True)


async def serve_workers(
    settings: Settings,
    backends: list[BackendConfig],
    sock: socket.socket,
    lifecycle: Lifecycle,
    budget: DescriptorBudget,
    metrics: GatewayMetrics,
    metrics_dir: str,
    *,
    count: int,
    wait_for_backends: bool,
) -> None:
    """Run `count` workers until a stop signal, with the gateway's health checks in this process.

    `metrics` (multiprocess, in `metrics_dir`) is this process's: backend restarts are counted there.
    """
    workers = WorkerSet(settings, backends, sock, count, metrics_dir)
    runtime = Runtime(settings, backends, make_policy(settings.resolved_policy), metrics, budget, board=workers.board)
    await runtime.start(serving=False)  # upstream pools and the gateway's one health checker
    try:
        workers.start()
        try:
            await lifecycle.unless_stopped(workers.listening())
            await lifecycle.unless_stopped(announce(runtime, sock, wait_for_backends, f"  workers={count}"))
            await workers.keep(lifecycle.stop)
        except Stopped:
            pass
        await workers.drain(settings.server.drain_timeout, lifecycle.force)
    finally:
        workers.kill()  # none left after a drain; after a failure here, no worker may outlive the parent
        await runtime.stop()
        workers.close()
