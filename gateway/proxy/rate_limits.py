"""OpenAI's rate-limit headers from a tenant's buckets, and the 429 that refuses a request over them.

`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` as OpenAI sends them, on every response of
a tenant with that limit: the reset is the time until the bucket is full again, as a Go duration
(`12ms`, `1s`, `6m0s`: what OpenAI sends and its clients parse). A 429 adds `Retry-After` in
whole seconds, rounded up, and names the tenant (never its key) and the limit it hit.
"""

from __future__ import annotations

import math

from gateway.errors import OpenAIError
from gateway.pool.tenant_limits import Quota, Refusal


def go_duration(seconds: float) -> str:
    """`seconds` as Go's `time.Duration` prints it, rounded up to the millisecond: 12ms, 1.5s, 6m0s, 1h0m0s."""
    ms = math.ceil(max(seconds, 0.0) * 1000.0 - 1e-6)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0") + "s" if fraction else f"{whole}s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def quota_headers(requests: Quota | None, tokens: Quota | None) -> list[tuple[str, str]]:
    """The x-ratelimit-* headers of whichever buckets the tenant has."""
    headers = []
    for kind, quota in (("requests", requests), ("tokens", tokens)):
        if quota is not None:
            headers += [
                (f"x-ratelimit-limit-{kind}", str(quota.limit)),
                (f"x-ratelimit-remaining-{kind}", str(quota.remaining)),
                (f"x-ratelimit-reset-{kind}", go_duration(quota.reset)),
            ]
    return headers


def refused(tenant: str, refusal: Refusal) -> OpenAIError:
    """The 429 for a request of `tenant` its limits refuse, with its headers."""
    wait = go_duration(refusal.retry_after)
    if refusal.limit == "inflight":
        message = f"Too many requests in flight for tenant {tenant}: its limit is reached. Please retry when one finishes."
    else:
        quota = refusal.requests if refusal.limit == "requests" else refusal.tokens
        assert quota is not None, "a bucket refused without a quota"
        message = f"Rate limit reached for tenant {tenant} on {refusal.limit} per minute: limit {quota.limit}. Please try again in {wait}."
    headers = dict(quota_headers(refusal.requests, refusal.tokens))
    headers["Retry-After"] = str(max(1, math.ceil(refusal.retry_after)))
    kind = "tokens" if refusal.limit == "tokens" else "requests"  # OpenAI's error type for a rate limit
    return OpenAIError(429, message, code="rate_limit_exceeded", type=kind, headers=headers)
