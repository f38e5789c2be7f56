"""One simulator process: binds its ports at once, runs each role's engine and HTTP server on one
event loop, and handles SIGTERM/SIGINT as SGLang does: `/ready` and `/health` turn 503, running
requests finish (bounded by the drain timeout), then the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import uvicorn

from backends.sim.app import apply_fault, create_app
from backends.sim.endpoint import Endpoint
from backends.sim.engine import Engine
from backends.sim.faults import FaultState
from backends.sim.layout import ServerSlot, engine_core
from backends.sim.metrics import SimMetrics
from backends.sim.profiles import Profile
from backends.sim.responses import InjectedDrop
from backends.sim.settings import SimSettings
from backends.sim.timeline import Timeline
from backends.sim.tokenizer import PseudoText
from backends.uvicorn_server import UvicornServer

logger = logging.getLogger("backends.sim")

READY_MESSAGE = "The server is fired up and ready to roll!"
# How long uvicorn may take to flush responses still open once the drain is over.
_FLUSH_TIMEOUT_S = 5


class _QuietInjectedDrops(logging.Filter):
    """uvicorn logs a traceback when a response raises; for the drop_mid_stream fault that is the intent."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, InjectedDrop)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port), bound now so the port answers at once."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class SimProcess:
    """The endpoints of one `specgate sim` invocation and their shared lifecycle."""

    def __init__(self, settings: SimSettings, profile: Profile, slots: list[ServerSlot], launch_command: str) -> None:
        self.settings = settings
        self.profile = profile
        self.slots = slots
        self.launch_command = launch_command
        self.endpoints: list[Endpoint] = []
        self._servers: list[UvicornServer] = []
        self._stopping = False

    def _endpoint(self, slot: ServerSlot, port: int, timeline: Timeline, text: PseudoText, index: int) -> Endpoint:
        settings = self.settings
        role = slot.role
        core = engine_core(settings, self.profile, slot, index, text)
        table = core.table
        engine = Engine(core, timeline, time_scale=settings.time_scale)
        served = settings.served_model_name or self.profile.model_path
        metrics = None
        if settings.enable_metrics:
            metrics = SimMetrics(
                engine,
                model_name=served,
                context_length=self.profile.context_length,
                extra_labels=settings.metric_labels(role),
            )
            core.observer = metrics
        endpoint = Endpoint(
            role=role,
            host=settings.host,
            port=port,
            profile=self.profile,
            table=table,
            slot=slot,
            settings=settings,
            engine=engine,
            faults=FaultState(),
            metrics=metrics,
            served_model_name=served,
            launch_command=self.launch_command,
        )
        for fault in settings.test_faults:
            apply_fault(endpoint, fault)
        return endpoint

    async def run(self) -> None:
        """Serve until a signal has drained the process."""
        settings = self.settings
        loop = asyncio.get_running_loop()
        text = PseudoText(settings.seed)
        timelines = {slot.group: Timeline() for slot in self.slots}
        sockets: list[socket.socket] = []
        for index, slot in enumerate(self.slots):
            sock = bind(settings.host, slot.port)
            sockets.append(sock)
            self.endpoints.append(self._endpoint(slot, sock.getsockname()[1], timelines[slot.group], text, index))
        for endpoint in self.endpoints:
            config = uvicorn.Config(
                create_app(endpoint),
                http="httptools",
                ws="none",
                lifespan="off",
                log_level=settings.log_level,
                access_log=False,
                timeout_graceful_shutdown=_FLUSH_TIMEOUT_S,
            )
            self._servers.append(UvicornServer(config))
        logging.getLogger("uvicorn.error").addFilter(_QuietInjectedDrops())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        engines = [
            asyncio.create_task(ep.engine.run(), name=f"engine-{ep.role}-{ep.slot.group}") for ep in self.endpoints
        ]
        startup = asyncio.create_task(self._warm_up())
        several = len(timelines) > 1
        try:
            for endpoint in self.endpoints:
                logger.info(
                    "%s server (profile %s) listening on http://%s:%d%s",
                    endpoint.role,
                    self.profile.name,
                    settings.host,
                    endpoint.port,
                    f" (group {endpoint.slot.group})" if several else "",
                )
            await asyncio.gather(
                *(server.serve(sockets=[sock]) for server, sock in zip(self._servers, sockets, strict=True))
            )
        finally:
            for task in (startup, *engines):
                task.cancel()
            await asyncio.gather(startup, *engines, return_exceptions=True)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _warm_up(self) -> None:
        if self.settings.startup_delay > 0:
            await asyncio.sleep(self.settings.startup_delay)
        for endpoint in self.endpoints:
            if endpoint.status == "starting":
                endpoint.status = "up"
        logger.info(READY_MESSAGE)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping:
            logger.warning("Received %s again; exiting now", sig.name)
            for endpoint in self.endpoints:
                endpoint.engine.abort_all()
            for server in self._servers:
                server.force_exit = server.should_exit = True
            return
        self._stopping = True
        asyncio.get_running_loop().create_task(self._drain(sig))

    async def _drain(self, sig: signal.Signals) -> None:
        loop = asyncio.get_running_loop()
        for endpoint in self.endpoints:
            endpoint.status = "draining"
        live = sum(len(ep.engine.live) for ep in self.endpoints)
        logger.info("Received %s: draining %d requests (at most %.0f s)", sig.name, live, self.settings.drain_timeout)
        deadline = loop.time() + self.settings.drain_timeout
        while any(ep.engine.live for ep in self.endpoints) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        left = sum(ep.engine.abort_all() for ep in self.endpoints)
        if left:
            logger.warning("Drain timeout: aborted %d requests", left)
        for server in self._servers:
            server.should_exit = True
