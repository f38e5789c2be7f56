"""The gateway's descriptor budget: how many requests its open-file limit lets it hold at once.

A proxied request holds two descriptors while it runs (the client's socket and the upstream
socket; measured with /proc/self/fd under 1,000 concurrent streams). A fixed reserve covers the
listening socket, stdio, the event loop, log files, health-check and metrics connections. The
budget turns the limit into a number of requests, so the gateway refuses with 429 before the
process runs out of descriptors instead of failing somewhere inside a connect or an accept.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from backends.fdlimit import NofileLimit

DESCRIPTORS_PER_REQUEST = 2  # client socket + upstream socket


@dataclass(frozen=True)
class DescriptorBudget:
    """Open-file limit and what it allows."""

    soft_limit: int
    hard_limit: int
    reserve: int  # descriptors kept for everything but proxied requests
    capacity: int  # requests that may be in flight before the process would run out

    def admits(self, sockets_open: int) -> bool:
        """True when one more upstream socket fits beside the `sockets_open` (client and upstream) and the reserve."""
        return sockets_open + 1 + self.reserve <= self.soft_limit

    def describe(self, max_inflight: int) -> dict[str, int]:
        """The budget for /admin/status."""
        return {
            "open_files_soft_limit": self.soft_limit,
            "open_files_hard_limit": self.hard_limit,
            "descriptor_reserve": self.reserve,
            "inflight_capacity": self.capacity,
            "max_inflight": max_inflight,
            "effective_max_inflight": min(max_inflight, self.capacity),
        }


def plan_budget(limit: NofileLimit, reserve: int) -> DescriptorBudget:
    """The budget that `limit` (after raising it) leaves, keeping `reserve` descriptors aside."""
    soft = limit.soft if limit.soft != resource.RLIM_INFINITY else 1 << 20
    capacity = max((soft - reserve) // DESCRIPTORS_PER_REQUEST, 0)
    return DescriptorBudget(soft_limit=soft, hard_limit=limit.hard, reserve=reserve, capacity=capacity)


def current_budget(reserve: int) -> DescriptorBudget:
    """The budget under this process's limit as it is now (nothing raised)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return plan_budget(NofileLimit(soft_before=soft, soft=soft, hard=hard), reserve)


def hard_limit_warning(max_inflight: int, reserve: int = 64) -> str | None:
    """`inflight_cap_warning` for this host's hard open-file limit (what `specgate serve` raises to)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return None
    return inflight_cap_warning(hard, reserve, max_inflight)


def inflight_cap_warning(soft_limit: int, reserve: int, max_inflight: int) -> str | None:
    """A warning when an open-file limit of `soft_limit` caps `max_inflight`; None when it does not.

    For `specgate serve` at start-up and for `specgate plan` (pass the hard limit there: serve
    raises the soft limit to it).
    """
    capacity = max((soft_limit - reserve) // DESCRIPTORS_PER_REQUEST, 0)
    if capacity >= max_inflight:
        return None
    needed = max_inflight * DESCRIPTORS_PER_REQUEST + reserve
    return (
        f"the open-file limit ({soft_limit}) allows {capacity} requests in flight, below limits.max_inflight = "
        f"{max_inflight}; requests beyond {capacity} get 429. Raise the hard limit to at least {needed} "
        f"(ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=)"
    )
