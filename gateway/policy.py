"""The routing decision: which backend serves the next request.

A policy is a small object whose `choose` is a pure function of a `PoolSnapshot` (so each rule can be
tested with plain data); `route` adds what every policy shares: the forced-route header, and
falling back to the other backend when the chosen one cannot serve.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import PolicyConfig
from gateway.pool import PoolSnapshot


@dataclass(frozen=True)
class Decision:
    """Where a request goes and which rule sent it there (the `reason` metric label)."""

    backend: str
    reason: str


@dataclass(frozen=True)
class Completion:
    """What the gateway observed about one finished response; fed back to the policy."""

    backend: str
    output_tokens: int
    ttft: float  # seconds from dispatch to the first content chunk
    decode_seconds: float  # first to last content chunk
    mean_inflight: float  # the backend's mean in-flight count while this request decoded
    mean_pool_inflight: float  # the same for all backends together


class Policy(ABC):
    """Routing policy interface."""

    name: str

    @abstractmethod
    def choose(self, snapshot: PoolSnapshot) -> Decision:
        """Pick a backend for one more request, given the pool as it is now (before adding it)."""

    def observe(self, completion: Completion) -> None:  # noqa: B027 - static policies learn nothing
        """Learn from a finished response."""

    def attach(self, snapshot: Callable[[], PoolSnapshot]) -> None:  # noqa: B027 - static policies need no live view
        """Give the policy a live view of the pool, for beliefs that depend on the current load."""

    @property
    @abstractmethod
    def eagle_cap(self) -> int:
        """The most requests this policy sends the speculative backend at once (sizes its server)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Policy name, parameters and beliefs, for /admin/status."""


class ThresholdPolicy(Policy):
    """EAGLE while the total in-flight before this request is below `threshold`, else plain."""

    name = "threshold"

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def choose(self, snapshot: PoolSnapshot) -> Decision:
        if snapshot.total_inflight < self.threshold:
            return Decision(snapshot.speculative.name, "below_threshold")
        return Decision(snapshot.plain.name, "at_or_above_threshold")

    @property
    def eagle_cap(self) -> int:
        return max(self.threshold, 1)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold}


class SpillPolicy(Policy):
    """EAGLE while its own in-flight is below `eagle_max_inflight`, the overflow to plain.

    Under load this keeps the EAGLE server busy at its sweet spot instead of idle, so in a
    partitioned node its GPUs add to the plain server's throughput.
    """

    name = "spill"

    def __init__(self, eagle_max_inflight: int) -> None:
        self.eagle_max_inflight = eagle_max_inflight

    def choose(self, snapshot: PoolSnapshot) -> Decision:
        if snapshot.speculative.inflight < self.eagle_max_inflight:
            return Decision(snapshot.speculative.name, "eagle_below_cap")
        return Decision(snapshot.plain.name, "eagle_at_cap")

    @property
    def eagle_cap(self) -> int:
        return max(self.eagle_max_inflight, 1)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "eagle_max_inflight": self.eagle_max_inflight}


def make_policy(config: PolicyConfig) -> Policy:
    """Build the configured policy."""
    if config.name == "threshold":
        return ThresholdPolicy(config.threshold)
    if config.name == "spill":
        return SpillPolicy(config.eagle_max_inflight)
    if config.name == "adaptive":
        from gateway.adaptive import (
            AdaptivePolicy,  # imported here: it builds on this module's interface
        )

        return AdaptivePolicy.from_config(config)
    raise ValueError(f"unknown policy {config.name!r}")


def route(policy: Policy, snapshot: PoolSnapshot, forced: str | None = None) -> Decision | None:
    """Decide for one request; None when no backend can serve it.

    `forced` (the x-specgate-route header, already validated as a backend name) wins when that
    backend can serve; a forced request is never silently moved, so it gets None otherwise.
    """
    if forced is not None:
        return Decision(forced, "forced") if snapshot.get(forced).available else None
    decision = policy.choose(snapshot)
    if snapshot.get(decision.backend).available:
        return decision
    for other in snapshot.backends:
        if other.available:
            return Decision(other.name, "fallback_unavailable")
    return None
