"""Service tiers: OpenAI's `service_tier` as specgate's latency class.

A request names its tier in the body (`service_tier`, as OpenAI's API does) or, for clients that
cannot set that field, in the `x-specgate-service-tier` header; the body wins when both are given.
`auto` and `default` route as untiered requests do; `priority` gets the fastest predicted option and
a lane on the EAGLE servers; `flex` goes where it costs the node least and is the first refused
under overload. The routing rules are the policies' (`policies/lane.py`); this module holds what
the HTTP edge needs: the names, reading a request's tier, flex's admission, the response header,
and SGLang's own `priority` value for each tier.
"""

from __future__ import annotations

import math
from typing import Literal


from gateway.errors import OpenAIError

Tier = Literal["priority", "default", "flex"]
PRIORITY: Tier = "priority"
DEFAULT: Tier = "default"
FLEX: Tier = "flex"
TIERS: tuple[Tier, ...] = (PRIORITY, DEFAULT, FLEX)

TIER_FIELD = "service_tier"
TIER_HEADER = "x-specgate-service-tier"
# OpenAI's accepted values and the tier each one is served as ("scale" is OpenAI's reserved-capacity
# tier: specgate has none, so it is served as default, which the echo says).
_REQUESTED: dict[str, Tier] = {"auto": DEFAULT, "default": DEFAULT, "scale": DEFAULT, "priority": PRIORITY, "flex": FLEX}
# SGLang's `priority` request field per tier: with --enable-priority-scheduling SGLang runs higher
# values first (unless started with --schedule-low-priority-values-first).
SGLANG_PRIORITY: dict[Tier, int] = {PRIORITY: 1, DEFAULT: 0, FLEX: -1}


def requested_tier(field: object, header: str | None) -> Tier | None:
    """The tier a request asks for, from its body field (first) or header; None when it names none.

    An unknown value is a 400 naming the field or header it came from.
    """
    if field is not None:
        return _parse(field, TIER_FIELD)
    if header is not None:
        return _parse(header.strip().lower(), TIER_HEADER)
    return None


def _parse(value: object, param: str) -> Tier:
    tier = _REQUESTED.get(value) if isinstance(value, str) else None
    if tier is None:
        raise OpenAIError(
            400, f"{param} must be one of {', '.join(_REQUESTED)}, got {value!r}", param=param, code="invalid_service_tier"
        )
    return tier


def flex_admitted(inflight: int, limit: int, share: float) -> bool:
    """Whether a flex request may start with `inflight` requests held against the gateway's `limit`.

    Flex is refused once the gateway holds `share` of its limit, so the rest is left to the others.
    """
    return inflight < max(1, math.floor(share * limit))


def admit_tier(tier: Tier, inflight: int, limit: int, flex_share: float) -> None:
    """Raise the 429 (with Retry-After) that refuses a flex request under `flex_admitted`'s overload."""
    if tier == FLEX and not flex_admitted(inflight, limit, flex_share):
        raise OpenAIError(
            429,
            "flex requests are refused while the gateway is this busy, retry later",
            code="overloaded",
            headers={"Retry-After": "2"},
        )


def at_most(tier: Tier, ceiling: Tier | None) -> Tier:
    """`tier`, or `ceiling` when `tier` ranks above it (priority > default > flex; None: no ceiling)."""
    if ceiling is None or TIERS.index(tier) >= TIERS.index(ceiling):
        return tier
    return ceiling


def tier_header(tier: Tier) -> tuple[bytes, bytes]:
    """The response header that names the tier served."""
    return TIER_HEADER.encode(), tier.encode()
