"""End to end with the real `openai` client against `specgate serve`'s embedded default.

One gateway (two simulated backends, field-8gpu at time-scale 0.1, the threshold policy) serves
the whole module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess
from tests.gateway.conftest import serving

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    # The threshold policy: its routing is exact, so these tests can assert where each request went.
    env = {"SPECGATE_LAUNCH__TIME_SCALE": "0.1", "SPECGATE_POLICY__NAME": "threshold", "SPECGATE_POLICY__THRESHOLD": "2"}
    yield from serving(env)


@pytest.fixture
def aclient(gateway: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def inflight(gateway: GatewayProcess) -> dict[str, int]:
    status = httpx.get(gateway.url + "/admin/status").json()
    return {b["name"]: b["inflight"] for b in status["backends"]}


async def ainflight(http: httpx.AsyncClient) -> dict[str, int]:
    status = (await http.get("/admin/status")).json()
    return {b["name"]: b["inflight"] for b in status["backends"]}


def test_chat_non_streaming_has_usage_and_backend_header(client: openai.OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Say something."}], max_tokens=12
    )
    assert raw.headers["x-specgate-backend"] in ("eagle", "plain")
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 12
    assert completion.usage.prompt_tokens > 0


def test_chat_streaming_strips_the_usage_chunk_it_added(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count."}], max_tokens=10, stream=True
    )
    chunks = list(stream)
    assert chunks and all(c.choices for c in chunks)  # no `choices: []` chunk the client did not ask for
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_streaming_with_include_usage(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9


def test_completions_both_ways(client: openai.OpenAI, model: str) -> None:
    done = client.completions.create(model=model, prompt="Once upon a time", max_tokens=7)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens == 7
    parts = list(client.completions.create(model=model, prompt="Once upon a time", max_tokens=7, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices)


@pytest.mark.parametrize("backend", ["eagle", "plain"])
def test_forced_route_header(client: openai.OpenAI, model: str, backend: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_headers={"x-specgate-route": backend}
    )
    assert raw.headers["x-specgate-backend"] == backend


def test_sglang_extras_are_forwarded(client: openai.OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_body={"ignore_eos": True, "separate_reasoning": False, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert raw.parse().usage.completion_tokens == 3  # type: ignore[union-attr]


def test_unknown_model_is_a_404_openai_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_one_request_alone_goes_to_eagle(client: openai.OpenAI, model: str, gateway: GatewayProcess) -> None:
    assert inflight(gateway) == {"eagle": 0, "plain": 0}
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert raw.headers["x-specgate-backend"] == "eagle"


async def test_concurrent_long_requests_spill_to_plain(aclient: openai.AsyncOpenAI, model: str, gateway: GatewayProcess) -> None:
    async def one() -> str:
        raw = await aclient.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "tell a long story"}], max_tokens=60, stream=True
        )
        async for _ in raw.parse():
            pass
        return raw.headers["x-specgate-backend"]

    backends = await asyncio.gather(*(one() for _ in range(16)))
    # threshold 2: only requests that found fewer than 2 in flight may go to eagle
    assert 1 <= backends.count("eagle") <= 2, backends
    assert backends.count("plain") >= 14
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        assert await ainflight(http) == {"eagle": 0, "plain": 0}
        metrics = (await http.get("/metrics")).text
    assert 'specgate_inflight_requests{backend="eagle"} 0.0' in metrics
    assert 'specgate_inflight_requests{backend="plain"} 0.0' in metrics
    assert 'specgate_route_decisions_total{backend="plain",reason="at_or_above_threshold"}' in metrics


def test_server_and_model_info_pass_through(gateway: GatewayProcess) -> None:
    info = httpx.get(gateway.url + "/server_info")
    assert info.status_code == 200 and info.headers["x-specgate-backend"] == "eagle"
    assert info.json()["internal_states"][0]["avg_spec_accept_length"] > 1
    model_info = httpx.get(gateway.url + "/model_info")
    assert model_info.status_code == 200 and model_info.headers["x-specgate-backend"] == "eagle"
    # Relayed unchanged: the speculative backend's own answer, body and content type.
    urls = {b["name"]: b["url"] for b in httpx.get(gateway.url + "/admin/status").json()["backends"]}
    direct = httpx.get(urls["eagle"] + "/model_info")
    assert model_info.json() == direct.json() and model_info.json()["is_generation"] is True
    assert model_info.headers["content-type"] == direct.headers["content-type"]


def test_probes_and_admin_status(gateway: GatewayProcess) -> None:
    assert httpx.get(gateway.url + "/health").status_code == 200
    assert httpx.get(gateway.url + "/ready").status_code == 200
    status = httpx.get(gateway.url + "/admin/status").json()
    assert status["policy"] == {"name": "threshold", "threshold": 2}
    assert {b["name"]: b["speculative"] for b in status["backends"]} == {"eagle": True, "plain": False}
    assert all(b["state"] == "ready" for b in status["backends"])
