"""The live state of one gateway: pool, policy, upstream clients, health checker and metrics.

Everything the request path needs hangs off one `Runtime` object stored on the app, so a test can
build as many independent gateways as it likes. What the policy learns is fed to it where a
completion is recorded (`learn`), never on the routing path; with several workers a completion goes
through the board's ring, and each worker replays the others' between requests (`catch_up`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gateway.config import BackendConfig, Settings
from gateway.edge.descriptors import DescriptorBudget, current_budget
from gateway.metrics import GatewayMetrics
from gateway.policies import Completion, Policy, Progress
from gateway.pool.affinity import ResponseHomes, RidTable
from gateway.pool.backends import Backend, DecodeWindow, Pool
from gateway.pool.board import Board
from gateway.pool.health import HealthChecker
from gateway.pool.prefix import PrefixEstimate
from gateway.pool.tenant_limits import Limits, TenantLimits
from gateway.relay.pacing import TurnPacer
from gateway.telemetry.record import Telemetry
from gateway.upstream.client import UpstreamClient

ENDPOINTS = ("chat", "completions", "generate", "responses", "ollama_chat", "ollama_generate")
REQUESTS_PER_TURN = 4  # proxied requests that start per turn of the event loop (relay/pacing.py)
CATCH_UP_SECONDS = 0.05  # how stale another worker's completion may be when this one routes


class Runtime:
    """One gateway's state; `start`/`stop` bracket its life inside the event loop."""

    def __init__(
        self,
        settings: Settings,
        backends: list[BackendConfig],
        policy: Policy,
        metrics: GatewayMetrics,
        budget: DescriptorBudget | None = None,
        *,
        board: Board | None = None,
        poll_health: bool = True,
    ) -> None:
        """`board`: shared with the gateway's other workers (pool/board.py; default: this process's
        own); `poll_health=False`: another process runs the gateway's health checks."""
        self.settings = settings
        self.budget = budget or current_budget(settings.limits.fd_reserve)
        # The HTTP server's live client connections (uvicorn's set), once `specgate serve` attaches it.
        self.client_connections: set[Any] = set()
        self.policy = policy
        self.metrics = metrics
        self.pool = Pool(
            [
                Backend(b.name, b.url.rstrip("/"), b.speculative, served_model_name=b.served_model_name, group=b.group or "")
                for b in backends
            ],
            board,
        )
        self.upstreams = {
            b.name: UpstreamClient(
                b.url,
                api_key=b.api_key.get_secret_value() if b.api_key else None,
                timeouts=settings.timeouts,
                max_connections=max(min(b.max_connections, self.budget.capacity), 1),
            )
            for b in backends
        }
        if policy.lane is not None:
            policy.lane.share(self.pool.board)  # the lane is the gateway's, whichever worker saw the priority request
        policy.attach(self.pool.snapshot)
        self.health = HealthChecker(self.pool, self.upstreams, settings.health, poll=poll_health)
        self._draining = False
        self._catching_up: asyncio.Task[None] | None = None
        self.response_homes = ResponseHomes()  # which backend holds each stored Responses API response
        self.requests: set[Any] = set()  # proxied requests in progress (`ProxyResponse`), to end them on shutdown
        self.pacer = TurnPacer(REQUESTS_PER_TURN)
        self.rids = RidTable()  # where each in-flight native /generate runs, for /abort_request
        self.prefix_estimate = PrefixEstimate(len(backends))  # turns the prefix map's blocks into tokens
        self.telemetry: Telemetry | None = None  # traces and access log of a serving process, when either is on
        tenants = settings.security.tenants
        self.tenant_limits = TenantLimits(
            self.pool.board, [Limits(t.requests_per_minute, t.tokens_per_minute, t.max_inflight) for t in tenants]
        )
        metrics.prepare(self.pool.names, ENDPOINTS)
        metrics.prepare_tenants([t.name for t in tenants])
        metrics.watch(self.pool, self.beliefs)
        metrics.watch_budget(lambda: self.budget.capacity, lambda: len(self.client_connections))

    async def start(self, *, serving: bool = True) -> None:
        """Open upstream connection pools and start health checking; `serving` (a process that routes):
        also keep its policy caught up with the completions other workers record."""
        for upstream in self.upstreams.values():
            await upstream.start()
        self.health.start()
        if serving:
            self._catching_up = asyncio.create_task(self._keep_caught_up(), name="catch-up")
            self.telemetry = Telemetry.from_settings(self.settings, self.policy.name)  # its threads are this process's

    async def stop(self) -> None:
        """Stop health checking and close every upstream connection."""
        if self._catching_up is not None:
            self._catching_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._catching_up
        await self.health.stop()
        for upstream in self.upstreams.values():
            await upstream.close()
        if self.telemetry is not None:
            await self.telemetry.close()
            self.telemetry = None

    @property
    def draining(self) -> bool:
        """True once this process, or with several workers the gateway's parent, began shutting down."""
        return self._draining or self.pool.board.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value

    @property
    def inflight_limit(self) -> int:
        """Requests admitted at once: `limits.max_inflight`, or fewer when the open-file limit says so."""
        return min(self.settings.limits.max_inflight, self.budget.capacity)

    def sockets_open(self) -> int:
        """Client connections plus upstream connections (in use or idle): the descriptors requests hold."""
        return len(self.client_connections) + sum(u.open_connections for u in self.upstreams.values())

    def interrupt_requests(self) -> None:
        """End every proxied request still in progress, each with an error its client can see."""
        for response in list(self.requests):
            response.interrupt()

    def learn(self, completion: Completion) -> None:
        """Record a finished response for every worker's policy and teach it to this one's, with
        whatever the other workers recorded before it (every policy learns in the same order)."""
        self.pool.board.publish(_record(self.pool[completion.backend].index, completion))
        self.catch_up()

    def progress(self, backend: str, window: DecodeWindow) -> None:
        """Record a stretch of a response still streaming for every worker's policy; learned at the next
        catch-up (off the relay's path)."""
        self.pool.board.publish(_progress_record(self.pool[backend].index, window))

    def catch_up(self) -> None:
        """Teach the policy the completions and progress recorded since the last call (in publication order)."""
        names = self.pool.names
        for record in self.pool.board.unread():
            if record[1] == 0.0:  # no output tokens: a progress record (a completion has at least two)
                self.policy.paced(_progress(names, record))
            else:
                self.policy.observe(_completion(names, record))

    async def _keep_caught_up(self) -> None:
        while True:
            await asyncio.sleep(CATCH_UP_SECONDS)
            self.catch_up()
            self.tenant_limits.fold(time.monotonic())  # the tokens relayed here reach the other workers' admissions

    def beliefs(self) -> dict[str, Any]:
        """What the policy currently believes (empty for static policies)."""
        self.catch_up()
        return self.policy.describe().get("beliefs", {})

    def model_ids(self) -> list[str]:
        """Model ids clients may send: the configured public name and every backend's served name."""
        self.pool.sync()
        ids = [self.settings.server.model_name] if self.settings.server.model_name else []
        for backend in self.pool:
            if backend.served_model_name and backend.served_model_name not in ids:
                ids.append(backend.served_model_name)
        return ids

    @property
    def serving(self) -> bool:
        """True when a new request could be routed somewhere."""
        self.pool.sync()
        return not self.draining and any(b.available for b in self.pool)


def _record(index: int, c: Completion) -> tuple[float, ...]:
    """A completion as a board record (pool/board.py's layout)."""
    return (
        index, c.output_tokens, c.ttft, c.decode_seconds, c.mean_inflight, c.mean_group_inflight, c.token_chunks,
        c.prompt_tokens, c.cached_tokens, c.given, c.group_prompt_tokens,
    )


def _progress_record(index: int, w: DecodeWindow) -> tuple[float, ...]:
    """A stretch of a stream as a board record: a completion's layout with no output tokens."""
    return (index, 0.0, 0.0, w.seconds, w.mean_inflight, w.mean_group_inflight, w.chunks, 0.0, 0.0, 0.0, w.group_prompt_tokens)


def _progress(names: list[str], record: tuple[float, ...]) -> Progress:
    index, _, _, seconds, inflight, group_inflight, chunks, _, _, _, sent = record
    return Progress(names[int(index)], seconds, int(chunks), inflight, group_inflight, sent)


def _completion(names: list[str], record: tuple[float, ...]) -> Completion:
    index, tokens, ttft, decode, inflight, group_inflight, chunks, prompt, cached, given, sent = record
    return Completion(
        names[int(index)], int(tokens), ttft, decode, inflight, group_inflight, int(chunks), int(prompt), int(cached), int(given), sent
    )
