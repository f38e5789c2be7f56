"""Tenants end to end: `specgate serve` with two workers, its limits shared on the board, seen by real clients.

One gateway (two simulated field-8gpu backends at time-scale 0.1, two worker processes) serves the
module; each test has its tenant, so no test spends another's allowance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.testbed import GatewayProcess
from tests.gateway.conftest import serving
from tests.gateway.test_e2e_faults import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BURST_LIMIT = 6  # requests per minute: one every 10 s refills, far longer than a burst takes
TENANTS = [
    {"name": "burst", "api_keys": ["burst-key"], "requests_per_minute": BURST_LIMIT},
    {"name": "sdk", "api_keys": ["sdk-key"], "requests_per_minute": 1},
    {"name": "capped", "api_keys": ["capped-key"], "service_tier": "default"},
    {"name": "tokens", "api_keys": ["tokens-key"], "tokens_per_minute": 100},
]
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    env = {
        "SPECGATE_LAUNCH__TIME_SCALE": "0.1",
        "SPECGATE_SERVER__WORKERS": "2",
        "SPECGATE_SECURITY__API_KEYS": '["plain-key"]',
        "SPECGATE_SECURITY__TENANTS": orjson.dumps(TENANTS).decode(),
    }
    yield from serving(env)


@pytest.fixture(scope="module")
def model(gateway: GatewayProcess) -> str:
    models = httpx.get(gateway.url + "/v1/models", headers={"authorization": "Bearer plain-key"}).json()
    return models["data"][0]["id"]  # type: ignore[no-any-return]


def sdk(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def tenant_counts(gateway: GatewayProcess, family: str, other: str) -> dict[tuple[str, str], float]:
    """specgate_tenant_<family>_total by (tenant, `other` label), from /metrics (every worker's, summed)."""
    text = httpx.get(gateway.url + "/metrics").text
    return {
        (sample.labels["tenant"], sample.labels[other]): sample.value
        for metric in text_string_to_metric_families(text)
        if metric.name == f"specgate_tenant_{family}"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def test_a_burst_of_three_times_the_limit_gets_exactly_the_limit_through_two_workers(gateway: GatewayProcess, model: str) -> None:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4}

    async def burst() -> list[httpx.Response]:
        # A client per request: each its own connection, so the kernel spreads them over both workers.
        async def one() -> httpx.Response:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
                return await client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer burst-key"})

        return await asyncio.gather(*(one() for _ in range(3 * BURST_LIMIT)))

    responses = asyncio.run(burst())
    assert sorted(r.status_code for r in responses) == [200] * BURST_LIMIT + [429] * (2 * BURST_LIMIT)
    for resp in responses:
        assert resp.headers["x-ratelimit-limit-requests"] == str(BURST_LIMIT)
        assert "x-ratelimit-limit-tokens" not in resp.headers  # the tenant has no token limit
    for resp in (r for r in responses if r.status_code == 429):
        assert resp.headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(resp.headers["retry-after"]) <= 60 // BURST_LIMIT
        error = resp.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
        assert "burst" in error["message"] and "burst-key" not in resp.text
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in responses if r.status_code == 200)
    assert remaining == list(range(BURST_LIMIT))  # each admitted request saw one less left
    requests = tenant_counts(gateway, "requests", "status")
    assert (requests[("burst", "200")], requests[("burst", "429")]) == (BURST_LIMIT, 2 * BURST_LIMIT)


def test_the_openai_sdk_sees_the_429_and_its_headers(gateway: GatewayProcess, model: str) -> None:
    client = sdk(gateway, "sdk-key")
    first = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=4)
    assert (first.headers["x-ratelimit-remaining-requests"], first.headers["x-ratelimit-reset-requests"]) == ("0", "1m0s")
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    headers = refused.value.response.headers
    assert headers["x-ratelimit-limit-requests"] == "1" and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s") and 1 <= int(headers["retry-after"]) <= 60
    assert refused.value.code == "rate_limit_exceeded"


def test_a_tenant_capped_at_default_asking_for_priority_is_served_as_default(gateway: GatewayProcess, model: str) -> None:
    raw = sdk(gateway, "capped-key").chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=4, service_tier="priority"  # type: ignore[arg-type]
    )
    assert raw.headers["x-specgate-service-tier"] == "default"
    assert raw.parse().service_tier == "default"  # the body says which tier served it
    plain = sdk(gateway, "plain-key").chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=4, service_tier="priority"  # type: ignore[arg-type]
    )
    assert plain.service_tier == "priority"  # security.api_keys: no ceiling, as before tenants


def test_tokens_relayed_count_against_the_next_request(gateway: GatewayProcess, model: str) -> None:
    client = sdk(gateway, "tokens-key")
    first = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=150)  # over the 100 a minute
    assert first.usage is not None and first.usage.prompt_tokens + first.usage.completion_tokens > 100

    def refused() -> openai.RateLimitError | None:
        try:
            client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1)
        except openai.RateLimitError as exc:
            return exc
        return None

    # The worker that relayed the tokens hands them to the other's admissions at its next catch-up tick.
    exc = eventually(refused, 10, "a request refused on the tokens the first one used")
    assert exc.response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert exc.response.json()["error"]["type"] == "tokens"
    tokens = tenant_counts(gateway, "tokens", "kind")
    assert tokens[("tokens", "completion")] >= 150 and tokens[("tokens", "prompt")] > 0


def test_an_unknown_key_is_still_a_401_and_no_key_is_logged_or_exported(gateway: GatewayProcess, model: str) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        sdk(gateway, "burst-key-2").chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    sdk(gateway, "capped-key").chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    keys = [key for tenant in TENANTS for key in tenant["api_keys"]] + ["plain-key", "burst-key-2"]
    # What the gateway printed (its logs and the access log, on stdout by default) and what it exports;
    # each worker's access log is written in batches by a thread of its own.
    def logged() -> str:
        text = gateway.text()
        return text if '"tenant":"capped"' in text else ""

    output = eventually(logged, 10, "the access log line naming the tenant")
    seen = {"output": output, "metrics": httpx.get(gateway.url + "/metrics").text, "error": refused.value.response.text}
    assert '"tenant":"capped"' in seen["output"]  # the access log names tenants ...
    assert not [(where, key) for where, text in seen.items() for key in keys if key in text]  # ... never their keys
