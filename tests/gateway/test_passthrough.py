"""OpenAI's extras reach the backend exactly as the client sent them, through the app's validation and proxy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson

from gateway.app import create_app
from gateway.config import Settings
from gateway.metrics import GatewayMetrics
from gateway.policies.static import ThresholdPolicy
from gateway.pool.backends import Health
from gateway.runtime import Runtime
from tests.gateway.fake_backend import MODEL, FakeBackend, refused_url, serving

EXTRAS: dict[str, Any] = {
    "n": 2,
    "logprobs": True,
    "top_logprobs": 3,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "parallel_tool_calls": False,
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}},
    "stop": ["\n\n", "END"],
    "seed": 1234,
    "user": "user-42",
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_completion_tokens": 17,
    "temperature": 0.3,
    "logit_bias": {"50256": -100},
    "metadata": {"k": "v"},
    "separate_reasoning": True,  # an SGLang extra
}


@asynccontextmanager
async def app_client(eagle_url: str) -> AsyncIterator[httpx.AsyncClient]:
    backends = [
        {"name": "eagle", "url": eagle_url, "speculative": True, "served_model_name": MODEL},
        {"name": "plain", "url": refused_url(), "speculative": False, "served_model_name": MODEL},
    ]
    settings = Settings.model_validate({"backends": backends})
    rt = Runtime(settings, settings.grouped_backends, ThresholdPolicy(1), GatewayMetrics())
    for backend in rt.pool:
        backend.health = Health.READY
    for upstream in rt.upstreams.values():
        await upstream.start()
    try:
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client
    finally:
        for upstream in rt.upstreams.values():
            await upstream.close()


async def test_openai_extras_are_forwarded_unchanged() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **EXTRAS}
    async with serving(FakeBackend(tokens=2)) as fake, app_client(fake.url) as client:
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200
    # n > 1 gets no `rid` (SGLang wants one per choice) and the client asked for usage itself: nothing added.
    assert orjson.loads(fake.bodies[0]) == body


async def test_only_model_rid_and_the_usage_request_are_added() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **EXTRAS, "n": 1, "stream_options": None}
    async with serving(FakeBackend(tokens=2)) as fake, app_client(fake.url) as client:
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200 and b'"usage"' not in resp.content
    sent = orjson.loads(fake.bodies[0])
    assert sent.pop("rid") and sent.pop("stream_options") == {"include_usage": True}
    assert sent == {k: v for k, v in body.items() if k != "stream_options"}
