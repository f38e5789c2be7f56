"""Who a request is: the tenant its API key belongs to, matched in constant time.

`[[security.tenants]]` names clients and their limits; `security.api_keys` are clients without a
name or limits, as before tenants existed. `KeyRing.match` compares the presented key with every
configured key (`hmac.compare_digest`), so its time tells neither which key matched nor how much
of one. A matched tenant rides on the request's scope (`scope["state"]["tenant"]`, read back by
`request_tenant`); the key itself is never kept past the match, logged or echoed.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.types import Scope

from gateway.config import SecurityConfig
from gateway.tiers import Tier


@dataclass(frozen=True, slots=True)
class Tenant:
    """A named client: its place in `[[security.tenants]]` (the limiter's row), its name and limits (None: unlimited)."""

    index: int
    name: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_inflight: int | None = None
    service_tier: Tier | None = None  # the highest tier it is served as

    @property
    def limited(self) -> bool:
        """Whether any rate or in-flight limit applies to it."""
        return self.requests_per_minute is not None or self.tokens_per_minute is not None or self.max_inflight is not None


def tenants_of(security: SecurityConfig) -> tuple[Tenant, ...]:
    """The configured tenants, in the order of `[[security.tenants]]`."""
    return tuple(
        Tenant(i, t.name, t.requests_per_minute, t.tokens_per_minute, t.max_inflight, t.service_tier)
        for i, t in enumerate(security.tenants)
    )


class KeyRing:
    """Every client key (the tenants' and `api_keys`), and whose each one is."""

    def __init__(self, security: SecurityConfig) -> None:
        self._keys: list[tuple[bytes, Tenant | None]] = [(k.get_secret_value().encode(), None) for k in security.api_keys]
        for tenant, config in zip(tenants_of(security), security.tenants, strict=True):
            self._keys += [(k.get_secret_value().encode(), tenant) for k in config.api_keys]

    def __bool__(self) -> bool:
        """False when no client key is configured (the gateway is open)."""
        return bool(self._keys)

    def match(self, token: bytes) -> tuple[bool, Tenant | None]:
        """(whether `token` is a client key, the tenant it belongs to: None for `api_keys`).

        Every key is compared, whatever matched first.
        """
        matched, owner = False, None
        for key, tenant in self._keys:
            if hmac.compare_digest(token, key):
                matched, owner = True, tenant
        return matched, owner


def request_tenant(scope: Scope) -> Tenant | None:
    """The tenant authentication found for this request; None: no key, or an unnamed one."""
    state = scope.get("state")
    return None if state is None else state.get("tenant")
