"""Tenants at the edge: their configuration, which key belongs to whom, and the tier ceiling."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from gateway.config import SecurityConfig, Settings
from gateway.edge.auth import AuthMiddleware
from gateway.edge.tenants import KeyRing, Tenant, request_tenant, tenants_of
from gateway.tiers import DEFAULT, FLEX, PRIORITY, at_most

TENANTS = [
    {"name": "acme", "api_keys": ["acme-1", "acme-2"], "requests_per_minute": 60, "service_tier": "default"},
    {"name": "globex", "api_keys": ["globex-1"], "tokens_per_minute": 1000, "max_inflight": 2},
]


def security(**extra: Any) -> SecurityConfig:
    return SecurityConfig.model_validate({"api_keys": ["plain-key"], "tenants": TENANTS, **extra})


def test_tenants_keep_their_order_and_limits() -> None:
    acme, globex = tenants_of(security())
    assert acme == Tenant(0, "acme", requests_per_minute=60, service_tier=DEFAULT)
    assert globex == Tenant(1, "globex", tokens_per_minute=1000, max_inflight=2)
    assert acme.limited and globex.limited and not Tenant(2, "free").limited


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ([TENANTS[0], {**TENANTS[1], "name": "acme"}], "tenant names must be unique"),
        ([TENANTS[0], {**TENANTS[1], "api_keys": ["acme-2"]}], "one tenant only"),
        ([{**TENANTS[0], "api_keys": ["plain-key"]}], "one tenant only"),
        ([{**TENANTS[0], "name": 'acme"} 1'}], "name"),  # a name is a metric label: no quotes or spaces
        ([{**TENANTS[0], "api_keys": []}], "api_keys"),
        ([{**TENANTS[0], "requests_per_minute": 0}], "requests_per_minute"),
    ],
)
def test_invalid_tenants_are_refused_without_naming_a_key(tenants: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        SecurityConfig.model_validate({"api_keys": ["plain-key"], "tenants": tenants})
    assert message in str(info.value)
    for key in ("acme-1", "acme-2", "globex-1", "plain-key"):
        assert key not in str(info.value)


def test_tenants_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGATE_SECURITY__TENANTS", '[{"name": "env", "api_keys": ["e"], "max_inflight": 3}]')
    assert tenants_of(Settings().security) == (Tenant(0, "env", max_inflight=3),)


def test_the_key_ring_names_each_keys_tenant() -> None:
    ring = KeyRing(security())
    acme, globex = tenants_of(security())
    assert ring.match(b"acme-2") == (True, acme)
    assert ring.match(b"globex-1") == (True, globex)
    assert ring.match(b"plain-key") == (True, None)  # security.api_keys: an unnamed tenant without limits
    assert ring.match(b"acme-") == (False, None)
    assert ring.match(b"") == (False, None)
    assert not KeyRing(SecurityConfig())


@pytest.mark.parametrize(
    ("requested", "ceiling", "served"),
    [(PRIORITY, DEFAULT, DEFAULT), (PRIORITY, FLEX, FLEX), (DEFAULT, FLEX, FLEX), (FLEX, DEFAULT, FLEX), (PRIORITY, None, PRIORITY)],
)
def test_a_tier_ceiling_lowers_and_never_raises(requested: str, ceiling: str | None, served: str) -> None:
    assert at_most(requested, ceiling) == served  # type: ignore[arg-type]


async def test_authentication_puts_the_tenant_on_the_request_and_401s_unknown_keys() -> None:
    seen: list[Tenant | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(request_tenant(scope))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    transport = httpx.ASGITransport(app=AuthMiddleware(app, security()))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        for key in ("acme-1", "plain-key"):
            assert (await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})).status_code == 204
        refused = await client.get("/v1/models", headers={"authorization": "Bearer acme-3"})
    assert seen == [tenants_of(security())[0], None]
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert "acme" not in refused.text


def test_no_configuration_error_echoes_a_key() -> None:
    twice = {"name": "b", "url": "http://b", "speculative": True}
    with pytest.raises(ValidationError) as info:
        Settings.model_validate({"security": {"api_keys": ["sekrit-key"]}, "backends": [twice, twice]})
    assert "backend names must be unique" in str(info.value) and "sekrit-key" not in str(info.value)
