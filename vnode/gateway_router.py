"""specgate's routing in virtual time: the gateway's own pool, policy and feedback, fed as the gateway feeds them.

Per request, what `gateway/proxy/admission.py` and `exchange.py` do: the in-flight limit and the
service tier's admission, then `route(policy, pool.snapshot(), tier=...)`, `Pool.acquire` (with the
request's `max_tokens`) and `policy.routed`; `Slot.mark_token` per token-bearing chunk, each stretch
of progress it reports learned at once; at the end the usage (`Pool.record_output`) and, for a
stream of at least two tokens, the `Completion` the relay builds from the slot's decode window,
learned then (one worker: the board's ring replays each record to the policy as it is recorded); the
slot is released last. The pool runs on the
model's clock; every backend is ready from the start, as the envelope waits for them to be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.errors import OpenAIError
from gateway.policies import Completion, Policy, Progress, route
from gateway.pool.backends import Backend, DecodeWindow, Health, Pool, Slot
from gateway.tiers import DEFAULT, admit_tier, requested_tier
from vnode.requests import Request
from vnode.router import Refused


@dataclass(frozen=True)
class BackendSpec:
    """One backend as the gateway lists it: its name, kind and GPU group."""

    name: str
    speculative: bool
    group: str


@dataclass(slots=True)
class _Flight:
    slot: Slot
    arrived: float
    first_token_at: float | None = None
    token_chunks: int = 0


class GatewayRouter:
    """Routes with a real `gateway.policies` policy over a real `gateway.pool.Pool`; see the module docstring."""

    def __init__(
        self,
        policy: Policy,
        backends: Sequence[BackendSpec],
        clock: Callable[[], float],
        *,
        inflight_limit: int,
        flex_share: float,
    ) -> None:
        self.policy = policy
        self.pool = Pool(
            [Backend(b.name, f"vnode:{b.name}", b.speculative, group=b.group, health=Health.READY) for b in backends],
            clock=clock,
        )
        if policy.lane is not None:
            policy.lane.share(self.pool.board)
        policy.attach(self.pool.snapshot)
        self.inflight_limit = inflight_limit
        self.flex_share = flex_share
        self._index = {b.name: i for i, b in enumerate(backends)}
        self._flights: dict[str, _Flight] = {}

    def route(self, request: Request, now: float, pending: int = 0) -> int:
        pool = self.pool
        pool.pending = pending
        inflight = pool.total_inflight
        try:
            if inflight >= self.inflight_limit:
                raise OpenAIError(429, "too many requests in flight, retry shortly", code="overloaded")
            tier = requested_tier(request.service_tier, None) or DEFAULT
            admit_tier(tier, inflight, self.inflight_limit, self.flex_share)
        except OpenAIError as err:
            raise Refused(err.status, err.message) from None
        snapshot = pool.snapshot()
        decision = route(self.policy, snapshot, None, tier)
        if decision is None:
            raise Refused(503, "no backend is ready to serve")
        slot = pool.acquire(decision.backend, request.max_tokens)
        slot.on_progress = self._progress
        self.policy.routed(snapshot, decision)
        self._flights[request.rid] = _Flight(slot, now)
        return self._index[decision.backend]

    def _progress(self, backend: str, window: DecodeWindow) -> None:
        self.policy.paced(Progress(backend, window.seconds, window.chunks, window.mean_inflight, window.mean_group_inflight))

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        flight = self._flights[request.rid]
        flight.slot.mark_token(now)
        if flight.first_token_at is None:
            flight.first_token_at = now
        flight.token_chunks += 1

    def finish(self, request: Request, now: float, output_tokens: int | None) -> None:
        flight = self._flights.pop(request.rid)
        slot = flight.slot
        if output_tokens is not None:
            name = slot.backend.name
            self.pool.record_output(name, output_tokens)
            window = slot.decode_window()
            if output_tokens >= 2 and window is not None and flight.first_token_at is not None:
                self.policy.observe(
                    Completion(
                        backend=name,
                        output_tokens=output_tokens,
                        ttft=flight.first_token_at - flight.arrived,
                        decode_seconds=window.seconds,
                        mean_inflight=window.mean_inflight,
                        mean_group_inflight=window.mean_group_inflight,
                        token_chunks=flight.token_chunks,
                    )
                )
        slot.release()
