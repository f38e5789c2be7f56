"""The proxied request, driven as ASGI against scripted backends: where it goes, what the client
gets, and that its in-flight slot returns on every path (done, upstream error, client gone,
timeout, failover)."""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.fdlimit import NofileLimit
from gateway.config import Settings
from gateway.edge.descriptors import plan_budget
from gateway.metrics import GatewayMetrics
from gateway.policies import Completion, Decision, Prompt
from gateway.policies.static import ThresholdPolicy
from gateway.pool.backends import Health
from gateway.pool.snapshot import PoolSnapshot
from gateway.proxy.exchange import ProxyResponse
from gateway.proxy.job import ProxyJob
from gateway.runtime import Runtime
from gateway.upstream.errors import ConnectFailed
from tests.gateway.fake_backend import MODEL, FakeBackend, refused_url, serving


class RecordingPolicy(ThresholdPolicy):
    """Threshold 1 (a lone request goes to EAGLE) that records what the gateway tells it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.placed: list[Decision] = []
        self.completions: list[Completion] = []

    def routed(self, snapshot: PoolSnapshot, decision: Decision, prompt: Prompt | None = None) -> None:
        self.placed.append(decision)

    def observe(self, completion: Completion) -> None:
        self.completions.append(completion)


@asynccontextmanager
async def gateway(eagle_url: str, plain_url: str, **sections: Any) -> AsyncIterator[Runtime]:
    """A runtime with both backends ready and its upstream pools open; no health polling."""
    backends = [
        {"name": "eagle", "url": eagle_url, "speculative": True, "served_model_name": MODEL},
        {"name": "plain", "url": plain_url, "speculative": False, "served_model_name": MODEL},
    ]
    settings = Settings.model_validate({"backends": backends, **sections})
    rt = Runtime(settings, settings.grouped_backends, RecordingPolicy(), GatewayMetrics())
    for backend in rt.pool:
        backend.health = Health.READY
    for upstream in rt.upstreams.values():
        await upstream.start()
    try:
        yield rt
    finally:
        for upstream in rt.upstreams.values():
            await upstream.close()


@dataclass
class Exchange:
    """What the client received."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    def error(self) -> dict[str, Any]:
        return orjson.loads(self.body)["error"]


async def call(rt: Runtime, *, forced: str | None = None, gone: asyncio.Event | None = None, seen: Exchange | None = None) -> Exchange:
    """One streamed chat through `ProxyResponse`; setting `gone` is the client hanging up."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    job = ProxyJob("chat", "/v1/chat/completions", body, True, False, forced, "rid-1", time.monotonic())
    exchange = seen or Exchange()
    hang_up = gone or asyncio.Event()

    async def receive() -> dict[str, Any]:
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        exchange.messages.append(message)

    await ProxyResponse(rt, job)({"type": "http"}, receive, send)
    return exchange


def inflight(rt: Runtime) -> dict[str, int]:
    return {b.name: b.inflight for b in rt.pool}


def sample(rt: Runtime, name: str, **labels: str) -> float:
    return rt.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_finished_stream_is_relayed_measured_and_released() -> None:
    async with serving(FakeBackend(tokens=4)) as fake, gateway(fake.url, refused_url()) as rt:
        exchange = await call(rt)
        assert exchange.status == 200 and exchange.headers["x-specgate-backend"] == "eagle"
        assert exchange.body.count(b'"content"') == 4 and exchange.body.endswith(b"data: [DONE]\n\n")
        assert b'"usage"' not in exchange.body  # asked for on the client's behalf, stripped again
        assert inflight(rt) == {"eagle": 0, "plain": 0} and rt.pacer.streams == 0
        policy = rt.policy
        assert isinstance(policy, RecordingPolicy)
        assert policy.placed == [Decision("eagle", "below_threshold")]
        (done,) = policy.completions
        # The only request in flight while it decoded: its slot's window says exactly one.
        assert done.backend == "eagle" and done.output_tokens == 4 and done.decode_seconds > 0
        assert abs(done.mean_inflight - 1.0) < 1e-9 and abs(done.mean_group_inflight - 1.0) < 1e-9
        assert sample(rt, "specgate_requests_total", backend="eagle", endpoint="chat", status="200") == 1


async def test_an_upstream_error_is_relayed_as_an_openai_error_and_released() -> None:
    async with serving(FakeBackend(mode="error", status=500)) as fake, gateway(fake.url, refused_url()) as rt:
        exchange = await call(rt)
        assert exchange.status == 500
        assert exchange.error()["message"] == "boom" and exchange.error()["code"] == "upstream_error"
        assert inflight(rt) == {"eagle": 0, "plain": 0}
        assert sample(rt, "specgate_upstream_errors_total", backend="eagle", kind="http_500") == 1
        assert rt.policy.completions == []  # type: ignore[attr-defined]


async def test_a_client_that_leaves_mid_stream_releases_its_slot_and_the_upstream() -> None:
    async with serving(FakeBackend(mode="stall")) as fake, gateway(fake.url, refused_url()) as rt:
        gone, seen = asyncio.Event(), Exchange()
        task = asyncio.create_task(call(rt, gone=gone, seen=seen))
        async with asyncio.timeout(10):
            while b'"content"' not in seen.body:  # the first token reached the client
                await asyncio.sleep(0.01)
        assert inflight(rt) == {"eagle": 1, "plain": 0} and rt.pacer.streams == 1  # new requests are paced
        gone.set()
        await asyncio.wait_for(task, 10)
        assert inflight(rt) == {"eagle": 0, "plain": 0} and rt.pacer.streams == 0
        assert sample(rt, "specgate_requests_total", backend="eagle", endpoint="chat", status="499") == 1


async def test_a_client_that_leaves_before_any_header_releases_its_slot() -> None:
    async with serving(FakeBackend(mode="hang")) as fake, gateway(fake.url, refused_url()) as rt:
        gone = asyncio.Event()
        task = asyncio.create_task(call(rt, gone=gone))
        async with asyncio.timeout(10):
            while fake.posts == 0:
                await asyncio.sleep(0.01)
        gone.set()
        await asyncio.wait_for(task, 10)
        assert inflight(rt) == {"eagle": 0, "plain": 0}


async def test_a_first_byte_timeout_is_504_marks_the_backend_failing_and_releases() -> None:
    async with serving(FakeBackend(mode="hang")) as fake, gateway(fake.url, refused_url(), timeouts={"first_byte": 0.2}) as rt:
        exchange = await call(rt)
        assert exchange.status == 504 and exchange.error()["code"] == "upstream_timeout"
        assert inflight(rt) == {"eagle": 0, "plain": 0}
        assert rt.pool["eagle"].health is Health.FAILING


async def test_a_silent_stream_ends_with_an_error_event_and_releases() -> None:
    async with serving(FakeBackend(mode="stall")) as fake, gateway(fake.url, refused_url(), timeouts={"idle": 0.2}) as rt:
        exchange = await call(rt)
        assert exchange.status == 200  # the header went out with the first token
        assert b"idle_timeout" in exchange.body and exchange.body.endswith(b"data: [DONE]\n\n")
        assert inflight(rt) == {"eagle": 0, "plain": 0} and rt.pacer.streams == 0
        assert sample(rt, "specgate_upstream_errors_total", backend="eagle", kind="idle_timeout") == 1
        assert rt.policy.completions == []  # type: ignore[attr-defined]


async def test_a_refused_connection_fails_over_once_with_exact_counts() -> None:
    async with serving(FakeBackend()) as plain, gateway(refused_url(), plain.url) as rt:
        exchange = await call(rt)
        assert exchange.status == 200 and exchange.headers["x-specgate-backend"] == "plain"
        assert inflight(rt) == {"eagle": 0, "plain": 0}
        assert (rt.pool["eagle"].served, rt.pool["plain"].served) == (1, 1)
        assert rt.pool["eagle"].health is Health.DOWN
        assert rt.policy.placed == [Decision("eagle", "below_threshold"), Decision("plain", "failover_retry")]  # type: ignore[attr-defined]
        assert sample(rt, "specgate_route_decisions_total", backend="plain", reason="failover_retry") == 1
        assert sample(rt, "specgate_upstream_errors_total", backend="eagle", kind="connect") == 1


async def test_a_forced_request_is_never_moved() -> None:
    async with serving(FakeBackend()) as plain, gateway(refused_url(), plain.url) as rt:
        exchange = await call(rt, forced="eagle")
        assert exchange.status == 502 and exchange.error()["code"] == "upstream_unreachable"
        assert plain.posts == 0 and inflight(rt) == {"eagle": 0, "plain": 0}
        assert rt.policy.placed == []  # type: ignore[attr-defined]  # the policy did not choose it


async def test_failover_is_tried_once_then_502() -> None:
    async with gateway(refused_url(), refused_url()) as rt:
        exchange = await call(rt)
        assert exchange.status == 502 and exchange.error()["code"] == "upstream_unreachable"
        assert exchange.headers["x-specgate-backend"] == "plain"
        assert inflight(rt) == {"eagle": 0, "plain": 0}
        assert (rt.pool["eagle"].served, rt.pool["plain"].served) == (1, 1)


async def test_a_connect_the_gateway_itself_cannot_make_is_503_and_leaves_the_backend_alone() -> None:
    async with serving(FakeBackend()) as plain, gateway(refused_url(), plain.url) as rt:

        async def out_of_descriptors(path: str, body: bytes, headers: bytes = b"") -> Any:
            raise ConnectFailed("cannot connect") from OSError(errno.EMFILE, "x")

        rt.upstreams["eagle"].post = out_of_descriptors  # type: ignore[method-assign]
        exchange = await call(rt)
        assert exchange.status == 503 and exchange.headers["retry-after"] == "1"
        assert exchange.error()["code"] == "gateway_overloaded"
        assert rt.pool["eagle"].health is Health.READY  # no evidence about the backend
        assert plain.posts == 0  # not failed over into the same wall
        assert inflight(rt) == {"eagle": 0, "plain": 0}
        assert sample(rt, "specgate_local_errors_total", kind="emfile") == 1
        assert sample(rt, "specgate_upstream_errors_total", backend="eagle", kind="local_resource") == 1


async def test_beyond_the_descriptor_budget_requests_get_429_and_their_connection_closed() -> None:
    async with serving(FakeBackend()) as fake, gateway(fake.url, fake.url) as rt:
        rt.budget = plan_budget(NofileLimit(soft_before=100, soft=100, hard=100), reserve=64)
        rt.client_connections = {object() for _ in range(40)}  # 40 + 64 > 100: no room for an upstream socket
        exchange = await call(rt)
        assert exchange.status == 429 and exchange.headers["retry-after"] == "1"
        assert exchange.headers["connection"] == "close"
        assert fake.posts == 0 and inflight(rt) == {"eagle": 0, "plain": 0}
        assert sample(rt, "specgate_local_errors_total", kind="descriptors") == 1
        rt.client_connections = set()
        assert (await call(rt)).status == 200


async def test_the_descriptor_capacity_caps_max_inflight() -> None:
    async with serving(FakeBackend()) as fake, gateway(fake.url, fake.url) as rt:
        rt.budget = plan_budget(NofileLimit(soft_before=64, soft=64, hard=64), reserve=64)
        assert rt.budget.capacity == 0 and rt.inflight_limit == 0
        exchange = await call(rt)
        assert exchange.status == 429 and exchange.error()["code"] == "overloaded"
        assert sample(rt, "specgate_local_errors_total", kind="inflight_capacity") == 1
