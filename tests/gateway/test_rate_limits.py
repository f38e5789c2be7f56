"""OpenAI's rate-limit headers: the reset as a Go duration, which buckets appear, the 429's Retry-After."""

from __future__ import annotations

import pytest

from gateway.pool.tenant_limits import Quota, Refusal
from gateway.proxy.rate_limits import go_duration, quota_headers, refused


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"), (-1.0, "0s"), (0.012, "12ms"), (0.0121, "13ms"), (0.9999, "1s"), (1.0, "1s"), (8.64, "8.64s"),
        (59.5, "59.5s"), (60.0, "1m0s"), (360.0, "6m0s"), (179.56, "2m59.56s"), (3600.0, "1h0m0s"), (3723.5, "1h2m3.5s"),
    ],
)
def test_resets_read_as_go_durations_rounded_up(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_only_the_tenants_buckets_are_reported() -> None:
    assert quota_headers(None, None) == []
    assert quota_headers(Quota(60, 59, 1.0), None) == [
        ("x-ratelimit-limit-requests", "60"), ("x-ratelimit-remaining-requests", "59"), ("x-ratelimit-reset-requests", "1s"),
    ]
    assert dict(quota_headers(None, Quota(1000, 0, 90.25)))["x-ratelimit-reset-tokens"] == "1m30.25s"


def test_a_refusal_is_openais_429_with_retry_after_in_whole_seconds() -> None:
    err = refused("acme", Refusal("tokens", 0.2, Quota(10, 3, 42.0), Quota(1000, 0, 60.2)))
    assert (err.status, err.code, err.type) == (429, "rate_limit_exceeded", "tokens")
    assert err.headers["Retry-After"] == "1"  # rounded up, never 0
    assert err.headers["x-ratelimit-remaining-requests"] == "3" and err.headers["x-ratelimit-reset-tokens"] == "1m0.2s"
    assert "acme" in err.message and "1000" in err.message
    busy = refused("acme", Refusal("inflight", 1.0, None, None))
    assert busy.type == "requests" and busy.headers == {"Retry-After": "1"}
