"""Run a launch plan: start the backend processes, wait until they are ready, keep them alive,
stop them with nothing left behind.

The same code runs real SGLang servers and the simulator; only the plan's argv differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any

import aiohttp

from backends.plan import Endpoint, LaunchPlan, ProcessSpec, redact_argv
from backends.process import Child
from backends.readiness import Probe, RejectedError, Stage, wait_ready
from backends.startup_display import StartupDisplay

log = logging.getLogger("specgate.supervisor")
# A backend's own story (its command line, then its output from backends.process) has a logger of its own.
backend_log = logging.getLogger("specgate.backend")


class SupervisorError(RuntimeError):
    """A backend did not become ready (timeout, exit, rejected probe); carries its last log lines."""


class Supervisor:
    """Starts, watches and stops the processes of one `LaunchPlan`."""

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        startup_timeout: float,
        backoff_initial: float,
        backoff_max: float,
        stop_timeout: float,
        on_restart: Callable[[str], None] | None = None,
        api_key: str | None = None,
        progress: bool | None = None,
        stable_after: float = 60.0,
    ) -> None:
        """`stable_after`: seconds of uptime after which a crash restarts with the initial backoff again."""
        self._plan = plan
        self._startup_timeout = startup_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stop_timeout = stop_timeout
        self._stable_after = stable_after
        self._on_restart = on_restart
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._progress = sys.stderr.isatty() if progress is None else progress
        self._specs = {spec.name: spec for spec in plan.processes}
        self._children = [Child(spec.name, spec.argv, env=spec.env) for spec in plan.processes]
        self._backoff = {child.name: backoff_initial for child in self._children}
        self._restarts = {endpoint.backend: 0 for endpoint in plan.endpoints}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready_again: dict[str, asyncio.Task[None]] = {}

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts so far, per backend name (a colocated process counts for both its backends)."""
        return dict(self._restarts)

    @property
    def pids(self) -> dict[str, int]:
        """The pid of each running process, by process name."""
        return {c.name: c.pid for c in self._children if c.running}

    async def start(self) -> None:
        """Start every process and return once every endpoint is ready.

        Raises SupervisorError (with the last log lines) when one exits or is not ready within
        `startup_timeout` seconds of its start; everything started is stopped first.
        """
        self._session = aiohttp.ClientSession()
        try:
            with self._display() as display:
                ready = {child.name: asyncio.Event() for child in self._children}
                async with asyncio.TaskGroup() as group:
                    for child in self._children:
                        group.create_task(self._start_after(child, ready, display))
        except BaseException as exc:
            await self.stop()
            if isinstance(exc, BaseExceptionGroup):
                errors = exc.subgroup(SupervisorError)
                if errors is not None:
                    raise errors.exceptions[0] from None
            raise
        for child in self._children:
            self._spawn_task(self._keep_alive(child), f"keep-alive-{child.name}")

    async def stop(self) -> None:
        """SIGTERM each process group, wait up to `stop_timeout`, SIGKILL the rest; reap all. Idempotent."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(child.stop(self._stop_timeout) for child in self._children))
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _display(self) -> AbstractContextManager[StartupDisplay | None]:
        if not self._progress:
            return contextlib.nullcontext()
        return StartupDisplay([e.backend for e in self._plan.endpoints])

    async def _start_after(
        self, child: Child, ready: dict[str, asyncio.Event], display: StartupDisplay | None
    ) -> None:
        """Start `child` once the process it waits for (`start_after`) is ready; then mark it ready."""
        after = self._specs[child.name].start_after
        if after is not None:
            await ready[after].wait()
        await self._start_one(child, display)
        ready[child.name].set()

    async def _start_one(self, child: Child, display: StartupDisplay | None) -> None:
        spec = self._specs[child.name]
        try:
            self._spawn(child, spec)
        except OSError as exc:
            raise SupervisorError(f"cannot start {child.name} ({spec.argv[0]}): {exc}") from exc
        ready: asyncio.Future[Any] = asyncio.gather(*(self._wait_endpoint(e, display) for e in spec.endpoints))
        exited: asyncio.Future[Any] = asyncio.ensure_future(child.wait())
        try:
            done, _ = await asyncio.wait(
                [ready, exited], timeout=self._startup_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in (ready, exited):
                waiter.cancel()
            await asyncio.gather(ready, exited, return_exceptions=True)
        if ready in done and ready.exception() is None:
            return
        if exited in done and not exited.cancelled():
            reason = f"exited with status {exited.result()} before it was ready"
        elif ready in done:
            reason = str(ready.exception())
        else:
            reason = f"not ready after {self._startup_timeout:g} s (launch.startup_timeout)"
        await child.clear_group()
        raise SupervisorError(f"backend process {child.name} {reason}; its last output:\n{child.last_lines()}")

    @staticmethod
    def _spawn(child: Child, spec: ProcessSpec) -> None:
        backend_log.info("[%s] starting: %s", child.name, " ".join(redact_argv(spec.argv)))
        child.start()

    async def _wait_endpoint(self, endpoint: Endpoint, display: StartupDisplay | None) -> None:
        assert self._session is not None
        loop = asyncio.get_running_loop()
        began = loop.time()

        def on_change(probe: Probe) -> None:
            if probe.stage is Stage.READY:
                log.info("[%s] ready at %s after %.1f s", endpoint.backend, endpoint.url, loop.time() - began)
            else:
                log.info("[%s] %s (%s)", endpoint.backend, probe.stage.value, probe.detail)
            if display is not None:
                display.update(
                    endpoint.backend, f"{probe.stage.value} ({probe.detail})", done=probe.stage is Stage.READY
                )

        try:
            await wait_ready(self._session, endpoint.url, self._headers, on_change)
        except RejectedError as exc:
            raise SupervisorError(f"{endpoint.backend}: {exc}") from exc

    async def _keep_alive(self, child: Child) -> None:
        """Restart `child` whenever it exits, with exponential backoff, until stop()."""
        while True:
            code = await child.wait()
            uptime = time.monotonic() - child.started_at
            # A crash of the launcher can leave its schedulers holding GPU memory: clear the group.
            await child.clear_group()
            if uptime >= self._stable_after:
                self._backoff[child.name] = self._backoff_initial
            log.error(
                "[%s] exited with status %s after %.1f s; restarting in %.1f s",
                child.name,
                _describe_status(code),
                uptime,
                self._backoff[child.name],
            )
            await self._respawn(child)

    async def _respawn(self, child: Child) -> None:
        while True:
            delay = self._backoff[child.name]
            self._backoff[child.name] = min(delay * 2, self._backoff_max)
            await asyncio.sleep(delay)
            try:
                self._spawn(child, self._specs[child.name])
            except OSError as exc:
                log.error("[%s] cannot start: %s; next try in %.1f s", child.name, exc, self._backoff[child.name])
                continue
            break
        for endpoint in self._specs[child.name].endpoints:
            self._restarts[endpoint.backend] += 1
            if self._on_restart is not None:
                try:
                    self._on_restart(endpoint.backend)
                except Exception:
                    log.exception("on_restart callback failed for %s", endpoint.backend)
            # Only to log when it is back; routing around it meanwhile is the gateway's health checker's job.
            previous = self._ready_again.get(endpoint.backend)
            if previous is not None:
                previous.cancel()
            self._ready_again[endpoint.backend] = self._spawn_task(
                self._wait_endpoint(endpoint, None), f"ready-again-{endpoint.backend}"
            )

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _describe_status(code: int) -> str:
    if code < 0:
        return f"{code} ({signal.Signals(-code).name})"
    return str(code)
