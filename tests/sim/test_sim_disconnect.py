"""Client disconnects and explicit aborts free the request's slot within one step.

The sim here runs 30x slow, so one EAGLE step at batch 1 takes about 430 ms: a request that leaves
the running set "within one step" is gone long before the next step could end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from backends.testbed import SimFactory, SimHandle

STEP_S = (5.82 + 8.47) * 30 / 1000  # field-8gpu EAGLE step at batch 1, time-scale 30


@pytest.fixture(scope="module")
def slow(module_sims: SimFactory) -> SimHandle:
    return module_sims.start(
        "--role",
        "eagle",
        "--time-scale",
        "30",
        "--max-running-requests",
        "1",
        "--enable-metrics",
        "--enable-test-endpoints",
    )


@pytest.fixture
async def http(slow: SimHandle) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=slow.url(), timeout=30) as client:
        yield client


async def raw_post(
    base_url: str, path: str, body: dict[str, object]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST on a socket of our own, so the test decides exactly when the connection goes away."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    payload = orjson.dumps(body)
    head = f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    writer.write(head.encode() + payload)
    await writer.drain()
    return reader, writer


async def load(http: httpx.AsyncClient) -> tuple[int, int]:
    entry = (await http.get("/v1/loads")).json()["loads"][0]
    return entry["num_running_reqs"], entry["num_waiting_reqs"]


async def metric(http: httpx.AsyncClient, name: str) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


async def until(check: str, http: httpx.AsyncClient, expected: tuple[int, int], timeout: float) -> float:
    """Seconds until /v1/loads shows (running, waiting) == expected; fails after `timeout`."""
    start = time.monotonic()
    while (await load(http)) != expected:
        assert time.monotonic() - start < timeout, f"{check}: still {await load(http)}"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def chat(rid: str, stream: bool, max_tokens: int = 5000) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "rid": rid,
    }


async def record(http: httpx.AsyncClient, rid: str) -> dict[str, object]:
    (entry,) = (await http.get("/_test/requests", params={"rid": rid})).json()
    return entry


async def test_stream_disconnect_leaves_running_set_within_one_step(slow: SimHandle, http: httpx.AsyncClient) -> None:
    aborted_before = await metric(http, "sglang:num_aborted_requests_total")
    reader, writer = await raw_post(slow.url(), "/v1/chat/completions", chat("disc-stream", stream=True))
    await asyncio.wait_for(reader.readuntil(b"data: "), 10)
    assert await load(http) == (1, 0)
    assert await metric(http, "sglang:num_running_reqs") == 1
    tokens_at_close = (await record(http, "disc-stream"))["completion_tokens"]
    writer.close()
    elapsed = await until("stream disconnect", http, (0, 0), timeout=STEP_S)
    assert elapsed < STEP_S
    assert await metric(http, "sglang:num_running_reqs") == 0
    assert await metric(http, "sglang:num_aborted_requests_total") == aborted_before + 1
    entry = await record(http, "disc-stream")
    assert entry["state"] == "aborted" and entry["finish_reason"] == "abort"
    assert entry["completion_tokens"] <= tokens_at_close + 4  # at most the step that was under way


async def test_non_streaming_disconnect_is_an_abort_too(slow: SimHandle, http: httpx.AsyncClient) -> None:
    _, writer = await raw_post(slow.url(), "/v1/chat/completions", chat("disc-whole", stream=False))
    await until("non-streaming request starts", http, (1, 0), timeout=10)
    writer.close()
    assert await until("non-streaming disconnect", http, (0, 0), timeout=STEP_S) < STEP_S
    assert (await record(http, "disc-whole"))["state"] == "aborted"


async def test_queued_request_disconnect_leaves_the_queue(slow: SimHandle, http: httpx.AsyncClient) -> None:
    _, first = await raw_post(slow.url(), "/v1/chat/completions", chat("queue-1", stream=False))
    _, second = await raw_post(slow.url(), "/v1/chat/completions", chat("queue-2", stream=False))
    await until("one running, one queued", http, (1, 1), timeout=10)
    second.close()
    await until("queued request gone", http, (1, 0), timeout=STEP_S)
    assert (await record(http, "queue-2"))["state"] == "aborted"
    first.close()
    await until("all gone", http, (0, 0), timeout=STEP_S)


async def test_abort_request_ends_a_stream_with_finish_reason_abort(http: httpx.AsyncClient) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=chat("abort-me", stream=True)) as resp:
        lines = resp.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                break
        assert (await http.post("/abort_request", json={"rid": "abort-me"})).status_code == 200
        rest = [line async for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert orjson.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "abort"
    assert await load(http) == (0, 0)


async def test_abort_all_answers_a_waiting_client(http: httpx.AsyncClient) -> None:
    pending = asyncio.create_task(http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 5000}))
    await until("request starts", http, (1, 0), timeout=10)
    assert (await http.post("/abort_request", json={"abort_all": True})).status_code == 200
    reply = (await asyncio.wait_for(pending, 5)).json()
    assert reply["choices"][0]["finish_reason"] == "abort"
    assert reply["usage"]["completion_tokens"] < 5000
