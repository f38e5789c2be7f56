"""End to end with the real `openai` client against `specgate serve`'s embedded default.

One gateway (two simulated backends, field-8gpu at time-scale 0.1, the threshold policy) serves
the whole module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

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
    async def start(max_tokens: int) -> tuple[str, Any]:
        raw = await aclient.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "tell a long story"}], max_tokens=max_tokens, stream=True
        )
        stream = raw.parse()
        await anext(aiter(stream))  # in flight: the gateway holds its slot until the stream ends
        return raw.headers["x-specgate-backend"], stream

    async def finish(stream: Any) -> None:
        async for _ in stream:
            pass

    # Threshold 2: the first two find 0 and 1 in flight and go to eagle; while both run (20,000
    # tokens: seconds), every other request finds 2 or more and goes to plain, however the machine
    # schedules them.
    first = [await start(20_000), await start(20_000)]
    rest = await asyncio.gather(*(start(60) for _ in range(14)))
    assert [backend for backend, _ in first] == ["eagle", "eagle"]
    assert [backend for backend, _ in rest] == ["plain"] * 14
    await asyncio.gather(*(finish(stream) for _, stream in rest))
    for _, stream in first:
        await stream.close()  # the client leaves: its slot is released
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        await _until(lambda: _inflight_is_zero(http), 10)
        metrics = (await http.get("/metrics")).text
    assert 'specgate_inflight_requests{backend="eagle"} 0.0' in metrics
    assert 'specgate_inflight_requests{backend="plain"} 0.0' in metrics
    assert 'specgate_route_decisions_total{backend="plain",reason="at_or_above_threshold"} 14.0' in metrics


async def _inflight_is_zero(http: httpx.AsyncClient) -> bool:
    return await ainflight(http) == {"eagle": 0, "plain": 0}


async def _until(condition: Callable[[], Awaitable[bool]], within: float) -> None:
    async with asyncio.timeout(within):
        while not await condition():
            await asyncio.sleep(0.02)


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
