"""Tenants' limits for the whole gateway: requests and tokens per minute as GCRA buckets, and requests in flight.

GCRA (the generic cell rate algorithm) is a token bucket kept as one time per limit, the instant it
will be full again. A tenant's bucket holds a minute's allowance and refills continuously: a burst
gets exactly the allowance, then the rate. Two floats per tenant: memory is bounded by the tenants,
not by the requests. OpenAI's rate-limit headers describe this bucket: remaining is what it holds,
reset the time until it is full again. The cells live on the board (`TenantRegion`) and change only
under the routing lock, which admission holds anyway, so the limits hold across workers at no lock
of their own; each worker's in-flight cell is its own to write. Tokens are counted as relayed into
this process's pending counts, folded into the buckets at this worker's next admission and at each
catch-up tick: a request is admitted on the tokens counted so far, and may overdraw the bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.pool.board import TENANT_REQUESTS, TENANT_SHARED, TENANT_TOKENS, Board

MINUTE = 60.0
_SLACK = 1e-9  # float error of a burst's summed intervals, so the allowance's last request still passes


def _unmarked(now: float) -> None:
    """What a lease marks before `metering` gave it the slot's mark."""


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's limits (None: none of that kind)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_inflight: int | None = None


@dataclass(frozen=True, slots=True)
class Quota:
    """One bucket as a response reports it: its allowance, what it holds now, seconds until it is full."""

    limit: int
    remaining: int
    reset: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the tenant's limits refuse: which limit, seconds until it would pass, the buckets."""

    limit: Literal["requests", "tokens", "inflight"]
    retry_after: float
    requests: Quota | None
    tokens: Quota | None


class Lease:
    """An admitted request's hold on its tenant's limits: its in-flight count (`release`, idempotent)
    and the tokens it is charged (`metering` per relayed chunk, `settle` with the usage)."""

    __slots__ = ("requests", "tokens", "_owner", "_index", "_inflight", "_metered", "_counted", "_mark")

    def __init__(self, owner: TenantLimits, index: int, inflight: bool, requests: Quota | None, tokens: Quota | None) -> None:
        self.requests = requests  # the buckets once this request was counted, for its response's headers
        self.tokens = tokens
        self._owner = owner
        self._index = index
        self._inflight = inflight  # counted in its worker's in-flight cell
        self._metered = tokens is not None
        self._counted = 0  # tokens charged so far
        self._mark: Callable[[float], None] = _unmarked

    def release(self) -> None:
        """The request ended: its in-flight count goes (later calls do nothing)."""
        if self._inflight:
            self._inflight = False
            self._owner._leave(self._index)

    def metering(self, mark: Callable[[float], None]) -> Callable[[float], None]:
        """`mark` (called per token-carrying chunk), also charging a token per chunk when the tenant
        has a token limit (a chunk carries one or more; `settle` charges the rest); else `mark`."""
        if not self._metered:
            return mark
        self._mark = mark
        return self._relayed

    def _relayed(self, now: float) -> None:
        self._mark(now)
        self._owner._pending[self._index] += 1.0
        self._counted += 1

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The response's usage: charge the tokens the chunks did not (the prompt, several per chunk)."""
        extra = prompt_tokens + completion_tokens - self._counted
        if self._metered and extra > 0:
            self._owner._pending[self._index] += extra
            self._counted += extra


class TenantLimits:
    """Every tenant's limits on `board` (one process's view); `limits[i]` is tenant i's."""

    def __init__(self, board: Board, limits: Sequence[Limits]) -> None:
        self._region = board.tenant_region(len(limits))
        self._routing = board.routing
        self._limits = tuple(limits)
        self._pending = [0.0] * len(limits)  # tokens relayed here, not yet in the shared buckets
        self._per_token = [MINUTE / t.tokens_per_minute if t.tokens_per_minute else 0.0 for t in limits]  # bucket seconds

    def admit(self, index: int, now: float) -> Lease | Refusal:
        """Count one request of tenant `index` at `now` (time.monotonic()), or say why not.

        The caller holds the board's routing lock, from this check to the slot it counts.
        """
        self._fold(now)
        limits, region = self._limits[index], self._region
        cells, base = region.cells, region.at + index * region.stride
        refused: Refusal | None = None
        if limits.max_inflight is not None:
            inflight = sum(cells[base + TENANT_SHARED + w] for w in range(region.workers))
            if inflight >= limits.max_inflight:
                refused = self._refusal("inflight", 1.0, cells, base, limits, now)
        rpm = limits.requests_per_minute
        if refused is None and rpm is not None:
            held = max(cells[base + TENANT_REQUESTS], now) - now  # seconds of allowance in use
            if held > MINUTE - MINUTE / rpm + _SLACK:
                refused = self._refusal("requests", held - (MINUTE - MINUTE / rpm), cells, base, limits, now)
        tpm = limits.tokens_per_minute
        if refused is None and tpm is not None:
            held = cells[base + TENANT_TOKENS] - now
            if held >= MINUTE:
                refused = self._refusal("tokens", held - MINUTE, cells, base, limits, now)
        if refused is not None:
            return refused
        if rpm is not None:
            cells[base + TENANT_REQUESTS] = max(cells[base + TENANT_REQUESTS], now) + MINUTE / rpm
        counted = limits.max_inflight is not None
        if counted:
            cells[base + TENANT_SHARED + region.worker] += 1.0
        return Lease(self, index, counted, _requests(cells, base, limits, now), _tokens(cells, base, limits, now))

    def fold(self, now: float) -> None:
        """Put the tokens relayed here since the last fold into the shared buckets (takes the routing lock)."""
        if any(self._pending):
            with self._routing:
                self._fold(now)

    def _fold(self, now: float) -> None:
        cells, region = self._region.cells, self._region
        for index, tokens in enumerate(self._pending):
            if tokens:
                at = region.at + index * region.stride + TENANT_TOKENS
                cells[at] = max(cells[at], now) + tokens * self._per_token[index]
                self._pending[index] = 0.0

    def _leave(self, index: int) -> None:
        region = self._region
        region.cells[region.at + index * region.stride + TENANT_SHARED + region.worker] -= 1.0

    @staticmethod
    def _refusal(limit: Literal["requests", "tokens", "inflight"], wait: float, cells: memoryview, base: int,
                 limits: Limits, now: float) -> Refusal:
        return Refusal(limit, wait, _requests(cells, base, limits, now), _tokens(cells, base, limits, now))


def _requests(cells: memoryview, base: int, limits: Limits, now: float) -> Quota | None:
    rpm = limits.requests_per_minute
    if rpm is None:
        return None
    held = max(cells[base + TENANT_REQUESTS] - now, 0.0)
    return Quota(rpm, max(math.floor(rpm - held * rpm / MINUTE + _SLACK), 0), held)


def _tokens(cells: memoryview, base: int, limits: Limits, now: float) -> Quota | None:
    tpm = limits.tokens_per_minute
    if tpm is None:
        return None
    held = max(cells[base + TENANT_TOKENS] - now, 0.0)
    return Quota(tpm, max(math.floor(tpm - held * tpm / MINUTE + _SLACK), 0), held)
