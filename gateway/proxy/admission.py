"""Whether a request may start and where it goes: the gateway's limits, the policy's decision and the slot it takes.

Reading the counts, deciding and counting the request are one step for the whole gateway: with
several workers, two that both read one request in flight would both send theirs to EAGLE under a
threshold of 2 (or past its cap), and both admit the request that fills the in-flight limit. So
admission holds the board's routing lock (pool/board.py) from its first read of the counts to its
slot's count; a waiter waits in the kernel, the lock is held for tens of microseconds (why not
spin: docs/benchmarks/gateway-overhead.md). With one process the lock is a no-op. A named tenant's
limits are checked under the same lock, once the request could otherwise be placed, so a request
the gateway refuses for its own reasons costs its tenant nothing. A decision that may move running
streams (a group's switch) asks the policy which of this worker's streams follow it, under the lock.
"""

from __future__ import annotations

import time

from typing import Protocol

from gateway.errors import OpenAIError
from gateway.policies import Decision, Prompt, Running, failover, route
from gateway.pool.backends import Slot
from gateway.pool.snapshot import PoolSnapshot
from gateway.pool.tenant_limits import Refusal
from gateway.proxy.job import ProxyJob
from gateway.proxy.rate_limits import refused
from gateway.runtime import Runtime
from gateway.tiers import admit_tier


def admit(rt: Runtime, job: ProxyJob) -> Slot:
    """Route the request and take its in-flight slot, or raise the error that says why not.

    The prefix map is read before and written after the routing lock: it is an estimate, and a
    long prompt's blocks take longer to look up than a decision should hold the lock.
    """
    prompt = _prompt(rt, job)
    with rt.pool.board.routing:
        slot = _admit(rt, job, prompt)
    _sent(rt, job, slot)
    return slot


def fail_over(rt: Runtime, job: ProxyJob, slot: Slot, failed: str) -> bool:
    """Move the request off `failed`, which refused the connection; False when there is nowhere to go.

    A forced request is never moved.
    """
    if job.forced is not None:
        return False
    prompt = _prompt(rt, job)
    with rt.pool.board.routing:
        moved = _move(rt, job, slot, failed, prompt)
    if moved:
        _sent(rt, job, slot)
    return moved


def continue_on(rt: Runtime, job: ProxyJob, slot: Slot, target: str, max_tokens: int | None, reason: str) -> None:
    """`slot`'s started response goes on on backend `target`, which was given its output so far (`reason`:
    the policy moved it, "switch", or its backend dropped it, "resume")."""
    with rt.pool.board.routing:
        source = slot.backend.name
        slot.continue_on(target, max_tokens)
    rt.metrics.moves.labels(source, target, reason).inc()
    _sent(rt, job, slot)


def resend_on(rt: Runtime, job: ProxyJob, slot: Slot, target: str, reason: str) -> None:
    """`slot`'s request, moved before its response began, is sent whole to backend `target` (`reason`: why the
    policy moved it, as its count is labelled)."""
    with rt.pool.board.routing:
        source = slot.backend.name
        slot.move_to(target)
    rt.metrics.moves.labels(source, target, reason).inc()
    _sent(rt, job, slot)


def resume_on(rt: Runtime, job: ProxyJob, failed: str) -> str | None:
    """Where a started stream that `failed` dropped goes on: the policy decides again, as for a failover
    (a forced request never moves); None: nowhere else."""
    if job.forced is not None:
        return None
    with rt.pool.board.routing:
        snapshot = rt.pool.snapshot()
        decision = failover(rt.policy, snapshot, failed, job.tier, job.prompt)
        if decision is not None:
            _placed(rt, job, snapshot, decision)
    return None if decision is None else decision.backend


class Movable(Protocol):
    """A response in progress as admission may move it: what it is running, and the request to move it."""

    def running(self, key: str) -> Running | None:
        """It as the policy sees a running request (named `key`); None while it cannot move."""
        ...

    def move(self, target: str, reason: str = "switch") -> None:
        """Continue it on backend `target` (`reason`: why, as its count is labelled)."""
        ...


def _prompt(rt: Runtime, job: ProxyJob) -> Prompt | None:
    """What the policy may know of the request's prompt: its length and each backend's predicted hold."""
    key = job.prefix
    if key is None:
        return None
    names = rt.pool.names
    prefixes = rt.pool.board.prefix
    held = prefixes.match(key.keys, len(names))
    estimate = rt.prefix_estimate
    cached = {name: estimate.cached_tokens(i, n) for i, (name, n) in enumerate(zip(names, held, strict=True)) if n}
    sent = prefixes.sent_at(key.keys, max(held, default=0))
    since = time.monotonic() - sent if sent is not None else None  # the clock `_sent` inserts with
    job.prompt = Prompt(estimate.prompt_tokens(key.size), cached, job.max_tokens, estimate.most_tokens(key.size), since)
    return job.prompt


def _sent(rt: Runtime, job: ProxyJob, slot: Slot) -> None:
    """The request's prompt blocks are on its backend now."""
    if job.prefix is not None:
        rt.pool.board.prefix.insert(job.prefix.keys, slot.backend.index, time.monotonic())


def _admit(rt: Runtime, job: ProxyJob, prompt: Prompt | None) -> Slot:
    if rt.draining:
        raise OpenAIError(503, "the gateway is shutting down", code="shutting_down", type="server_error")
    inflight = rt.pool.total_inflight
    # A batch wider than the whole limit still runs alone rather than never.
    if inflight >= rt.inflight_limit or (inflight and inflight + job.weight > rt.inflight_limit):
        if inflight >= rt.budget.capacity:
            rt.metrics.local_errors.labels("inflight_capacity").inc()
        raise OpenAIError(429, "too many requests in flight, retry shortly", code="overloaded", headers={"Retry-After": "1"})
    if not rt.budget.admits(rt.sockets_open()):
        # Closing this client's connection gives its descriptor back at once.
        rt.metrics.local_errors.labels("descriptors").inc()
        raise OpenAIError(
            429,
            "the gateway is at its open-file limit, retry shortly",
            code="overloaded",
            headers={"Retry-After": "1", "Connection": "close"},
        )
    admit_tier(job.tier, inflight, rt.inflight_limit, rt.settings.policy.tier_flex_inflight_share)
    snapshot = rt.pool.snapshot()
    decision = route(rt.policy, snapshot, job.forced, job.tier, prompt, handover=_can_hand_over(rt, job))
    if decision is None:
        target = f"backend {job.forced!r} is not" if job.forced else "no backend is"
        raise OpenAIError(503, f"{target} ready to serve", code="no_backend_available", type="server_error")
    lease = None
    tenant = job.tenant
    if tenant is not None and tenant.limited:
        lease = rt.tenant_limits.admit(tenant.index, time.monotonic())
        if isinstance(lease, Refusal):
            raise refused(tenant.name, lease)
    slot = rt.pool.acquire(decision.backend, job.max_tokens, job.weight, prompt.uncached(decision.backend) if prompt else 0.0, job.stream)
    slot.lease = lease
    _placed(rt, job, snapshot, decision)
    if job.forced is None and rt.policy.may_move(decision):
        _move_strays(rt, decision)
    return slot


def _move_strays(rt: Runtime, decision: Decision) -> None:
    """The requests this worker is streaming that the policy moves after `decision` (a group's switch)."""
    movable: dict[str, Movable] = {str(i): response for i, response in enumerate(rt.requests)}
    running = [r for key, response in movable.items() if (r := response.running(key)) is not None]
    if running:
        for key in rt.policy.moves(rt.pool.snapshot(), decision, running):
            movable[key].move(decision.decodes_on)


def _can_hand_over(rt: Runtime, job: ProxyJob) -> bool:
    """Whether the request's stream could go on on another backend after its first token (the exchange
    keeps such a stream's text: one sequence, a dialect that continues it, moves on)."""
    return rt.policy.move_running and job.stream and job.weight == 1 and job.forced is None and job.dialect.continues(job.body)


def _move(rt: Runtime, job: ProxyJob, slot: Slot, failed: str, prompt: Prompt | None) -> bool:
    snapshot = rt.pool.snapshot()
    decision = failover(rt.policy, snapshot, failed, job.tier, prompt)
    if decision is None:
        return False
    slot.move_to(decision.backend)
    _placed(rt, job, snapshot, decision)
    return True


def _placed(rt: Runtime, job: ProxyJob, snapshot: PoolSnapshot, decision: Decision) -> None:
    """The request holds its slot where `decision` says: count it, and tell the policy that chose it."""
    job.decision, job.decided_on = decision, snapshot
    rt.metrics.route_decisions.labels(decision.backend, decision.label).inc()
    if job.forced is None:
        rt.policy.routed(snapshot, decision, job.prompt)
