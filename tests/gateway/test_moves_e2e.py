"""A stream moved mid-answer: the gateway ends it on its backend between two token events and another
backend goes on with it (its text so far given back), one answer for the client; moved before its first
token, it is sent to the other backend whole.

Driven with the real `openai` client through the gateway's HTTP server against two simulated servers
(a greedy model: an answer continued elsewhere goes on exactly as it would have); the routing policy
is a threshold one that moves every running stream to plain once a second request arrives, one
that hands every request over to EAGLE after its first token, or one that drains the plain streams
to EAGLE when a response ends, so what is tested is the exchange's move, not when the adaptive
policy asks for one (test_stray_moves.py, test_handover.py, test_drain.py). Waits poll
a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import uvicorn

from backends.testbed import SimFactory
from gateway.app import create_app
from gateway.config import Settings
from gateway.edge.http_protocol import GatewayHttpProtocol
from gateway.http_server import connection_limits
from gateway.metrics import GatewayMetrics
from gateway.policies import Completion, Decision, DrainMark, Running
from gateway.policies.static import ThresholdPolicy
from gateway.pool.backends import Health
from gateway.policies import Policy, Prompt
from gateway.pool.snapshot import PoolSnapshot
from gateway.runtime import Runtime
from gateway.telemetry.record import Telemetry
from gateway.tiers import DEFAULT, Tier
from tests.gateway.fake_backend import MODEL, FakeBackend, refused_url, serving

pytestmark = [pytest.mark.timeout(60)]

MESSAGES = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
LIMIT = 60  # output tokens the moved answers ask for
SOON = 10.0


class ScriptedPolicy(ThresholdPolicy):
    """A threshold policy whose streams may move, as each subclass scripts it; it keeps what it learns."""

    move_running = True

    def __init__(self) -> None:
        super().__init__(1)
        self.learned: list[Completion] = []

    def observe(self, completion: Completion) -> None:
        self.learned.append(completion)


class MovingPolicy(ScriptedPolicy):
    """A lone request goes to EAGLE; the next goes to plain and takes every running stream with it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[Running]] = []

    def may_move(self, decision: Decision) -> bool:
        return decision.backend == "plain"

    def moves(self, snapshot: PoolSnapshot, decision: Decision, running: Sequence[Running]) -> list[str]:
        self.asked.append(list(running))
        return [r.key for r in running if r.backend != decision.backend]


class HandingOverPolicy(ScriptedPolicy):
    """Every request starts on plain, to be handed over to EAGLE after its first token."""

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        return Decision("plain", "test_handover", tier, then="eagle")


class DrainingPolicy(ScriptedPolicy):
    """Every request goes to plain; once a response ends, every stream still on plain goes on on EAGLE."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[DrainMark] = []

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        return Decision("plain", "test_drain", tier)

    def drain_mark(self, at: float) -> DrainMark | None:
        return DrainMark(at, 0, 0.001)

    def drain_moves(self, snapshot: PoolSnapshot, mark: DrainMark, running: Sequence[Running]) -> list[tuple[str, str]]:
        self.marks.append(mark)
        return [(r.key, "eagle") for r in running if r.backend == "plain"]


# The simulators' durations times this: an answer must outlast the routing of the request sent to move it
# on 2 busy cores. At 1, EAGLE streams the rest of a 60-token answer 0.2 s after its fifth chunk, and in a
# CI run the answer ended before the move; at 5, 1.1 s.
SLOW = "5"


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[str, str]]:
    with SimFactory() as factory:
        eagle = factory.start("--role", "eagle", "--enable-test-endpoints", "--enable-metrics", "--time-scale", SLOW)
        plain = factory.start("--role", "plain", "--time-scale", SLOW)
        yield eagle.url(), plain.url()


@asynccontextmanager
async def gateway(
    eagle_url: str, plain_url: str, access_log: Path | None = None, policy: Policy | None = None
) -> AsyncIterator[tuple[Runtime, openai.AsyncOpenAI]]:
    """A runtime over both backends (ready, no health polling) with `policy` (`MovingPolicy` by default),
    served on a loopback port by the gateway's own HTTP protocol (so streams take its C relay), and an
    `openai` client of it; with `access_log`, its access log goes there (written out when the block ends)."""
    backends = [
        {"name": "eagle", "url": eagle_url, "speculative": True},
        {"name": "plain", "url": plain_url, "speculative": False},
    ]
    settings = Settings.model_validate({"backends": backends, "logging": {"access_log": str(access_log) if access_log else "off"}})
    rt = Runtime(settings, settings.grouped_backends, policy or MovingPolicy(), GatewayMetrics())
    rt.telemetry = Telemetry.from_settings(settings, rt.policy.name)
    for backend in rt.pool:
        backend.health = Health.READY
    for upstream in rt.upstreams.values():
        await upstream.start()
    config = uvicorn.Config(
        create_app(rt), log_config=None, access_log=False, http=functools.partial(GatewayHttpProtocol, limits=connection_limits(rt))
    )
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await until(lambda: server.started, "the gateway listens")
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    try:
        yield rt, client
    finally:
        await client.close()
        server.should_exit = True
        await serving
        sock.close()
        for upstream in rt.upstreams.values():
            await upstream.close()
        if rt.telemetry is not None:
            await rt.telemetry.close()


def served_model(sims: tuple[str, str]) -> str:
    return httpx.get(sims[0] + "/v1/models").json()["data"][0]["id"]  # type: ignore[no-any-return]


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SOON
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {SOON} s: {what}")
        await asyncio.sleep(0.005)


def streaming_on(rt: Runtime, backend: str, chunks: int) -> bool:
    """A response streams on `backend` and has relayed at least `chunks` token chunks there."""
    return any(r.routed_to == backend and r._slot.chunks >= chunks for r in rt.requests)


def moves(rt: Runtime, source: str, target: str, reason: str = "switch") -> float:
    return rt.metrics.registry.get_sample_value("specgate_moves_total", {"from": source, "to": target, "reason": reason}) or 0.0


async def chat(
    client: openai.AsyncOpenAI, model: str, route: str | None = None, max_tokens: int = LIMIT, rid: str | None = None
) -> tuple[str, Any, list[Any]]:
    """Stream one chat answer (`rid`: the id SGLang knows it by); its text, usage and chunks."""
    stream = await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
        extra_headers={"x-specgate-route": route} if route else None, extra_body={"rid": rid} if rid else None,
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].usage, chunks


async def moved_while(rt: Runtime, answer: Awaitable[Any], client: openai.AsyncOpenAI, model: str) -> Any:
    """`answer`, started on EAGLE and moved to plain by a short request that arrives once it has streamed a while."""
    task = asyncio.ensure_future(answer)
    await until(lambda: streaming_on(rt, "eagle", 5), "the answer streams on EAGLE")
    await chat(client, model, max_tokens=4)  # routed to plain: the policy moves the running answer
    return await task


async def test_a_moved_chat_answer_reads_as_the_unmoved_one(sims: tuple[str, str], tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    async with gateway(*sims, access_log=log) as (rt, client):
        model = served_model(sims)
        reference, reference_usage, _ = await chat(client, model, route="eagle")  # forced: never moved
        text, usage, chunks = await moved_while(rt, chat(client, model), client, model)
        assert moves(rt, "eagle", "plain") == 1
        # The policy saw the running answer with its progress and limit.
        (running,) = [r for asked in rt.policy.asked for r in asked if r.backend == "eagle"]
        assert running.chunks >= 5 and running.max_tokens == LIMIT
        assert text == reference  # a greedy model goes on where it stopped
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference_usage.prompt_tokens, reference_usage.completion_tokens)
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(roles) == 1 and finishes == ["length"]  # one answer: opened once, ended once
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}
        # Moved mid-answer, it teaches nothing: the forced reference and the short request that moved it do.
        assert [(c.backend, c.output_tokens) for c in rt.policy.learned] == [("eagle", LIMIT), ("plain", 4)]
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    moved = [(line["backend"], line["completion_tokens"]) for line in lines if line["moved_from"] == "eagle"]
    assert moved == [("plain", LIMIT)]


def aborts_asked(sim_url: str) -> float:
    """The `/abort_request` calls a simulated server answered with 200."""
    for line in httpx.get(sim_url + "/metrics").text.splitlines():
        if line.startswith("sglang:http_responses_total{") and 'endpoint="/abort_request"' in line and 'status_code="200"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_stream_moved_before_its_first_token_is_sent_whole_where_it_moved(sims: tuple[str, str], tmp_path: Path) -> None:
    """A burst's first request is still waiting for its first token on EAGLE when the next one switches the
    group: it is offered to the move (nothing relayed yet), EAGLE is told to drop it, and plain answers it
    whole, as if it had been routed there."""
    log = tmp_path / "access.log"
    async with gateway(*sims, access_log=log) as (rt, client):
        model = served_model(sims)
        reference, reference_usage, _ = await chat(client, model, route="eagle")
        aborts = aborts_asked(sims[0])
        httpx.post(sims[0] + "/_test/fault", json={"kind": "slow_first_token", "seconds": 5}).raise_for_status()
        try:
            answer = asyncio.ensure_future(chat(client, model, rid="early-mover"))
            await until(lambda: any(r.routed_to == "eagle" for r in rt.requests), "the answer waits on EAGLE")
            await chat(client, model, max_tokens=4)  # routed to plain: the policy moves the waiting answer
            text, usage, chunks = await answer
        finally:
            httpx.post(sims[0] + "/_test/fault", json={"kind": "clear"}).raise_for_status()
        (waiting,) = [r for asked in rt.policy.asked for r in asked if r.backend == "eagle"]
        assert waiting.chunks == 0 and waiting.max_tokens == LIMIT
        assert moves(rt, "eagle", "plain") == 1
        assert aborts_asked(sims[0]) == aborts + 1
        (dropped,) = httpx.get(sims[0] + "/_test/requests", params={"rid": "early-mover"}).json()
        assert dropped["state"] == "aborted"
        assert text == reference
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference_usage.prompt_tokens, reference_usage.completion_tokens)
        assert len([c for c in chunks if c.choices and c.choices[0].delta.role]) == 1
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}
        # Moved with a switch, it teaches nothing: the forced reference and the short request that moved it do.
        assert [(c.backend, c.output_tokens) for c in rt.policy.learned] == [("eagle", LIMIT), ("plain", 4)]
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    moved = [(line["backend"], line["completion_tokens"]) for line in lines if line["moved_from"] == "eagle"]
    assert moved == [("plain", LIMIT)]


async def test_a_moved_completion_keeps_its_usage_and_limit(sims: tuple[str, str]) -> None:
    async with gateway(*sims) as (rt, client):
        model = served_model(sims)

        async def complete(route: str | None = None) -> Any:
            stream = await client.completions.create(
                model=model, prompt="Once upon a time", max_tokens=LIMIT, stream=True, stream_options={"include_usage": True},
                extra_headers={"x-specgate-route": route} if route else None,
            )
            return [c async for c in stream]

        reference = (await complete("eagle"))[-1].usage
        chunks = await moved_while(rt, complete(), client, model)
        assert moves(rt, "eagle", "plain") == 1
        usage = chunks[-1].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference.prompt_tokens, LIMIT)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}


async def test_a_stream_its_backend_drops_goes_on_elsewhere(sims: tuple[str, str]) -> None:
    """EAGLE cuts the connection a few chunks in: the policy places the answer again and plain finishes
    it, the client none the wiser; a forced answer is not moved and gets the error event."""
    async with gateway(*sims) as (rt, client):
        model = served_model(sims)
        reference, reference_usage, _ = await chat(client, model, route="eagle")
        httpx.post(sims[0] + "/_test/fault", json={"kind": "drop_mid_stream", "after_chunks": 5}).raise_for_status()
        try:
            text, usage, chunks = await chat(client, model)
            with pytest.raises(openai.APIError):
                await chat(client, model, route="eagle")
        finally:
            httpx.post(sims[0] + "/_test/fault", json={"kind": "clear"}).raise_for_status()
        assert moves(rt, "eagle", "plain", "resume") == 1 and moves(rt, "eagle", "plain") == 0
        assert text == reference
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference_usage.prompt_tokens, reference_usage.completion_tokens)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        dropped = sum(
            rt.metrics.registry.get_sample_value("specgate_upstream_errors_total", {"backend": "eagle", "kind": kind}) or 0.0
            for kind in ("disconnected", "truncated")
        )
        assert dropped == 2  # the resumed stream's and the forced one's
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}


async def test_answers_that_cannot_go_on_elsewhere_are_not_offered(sims: tuple[str, str]) -> None:
    async with gateway(*sims) as (rt, client):
        model = served_model(sims)
        stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=LIMIT, stream=True, n=2)

        async def two_choices() -> list[Any]:
            return [c async for c in await stream]

        chunks = await moved_while(rt, two_choices(), client, model)
        assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
        assert all(r.backend != "eagle" for asked in rt.policy.asked for r in asked)
        assert moves(rt, "eagle", "plain") == 0


async def test_a_move_nobody_can_take_ends_the_stream_with_an_error_and_frees_its_slot() -> None:
    """The target refuses connections and the backend it left counts no tokens: the client gets an
    error event after the text it had, nothing hangs, nothing stays in flight."""
    fake = FakeBackend(tokens=2000, token_gap=0.005)  # 10 s or more: it still streams when the move comes
    async with serving(fake), gateway(fake.url, refused_url()) as (rt, client):
        rt.pool["plain"].health = Health.READY
        answer = asyncio.ensure_future(chat(client, MODEL))
        await until(lambda: streaming_on(rt, "eagle", 5), "the answer streams on EAGLE")
        fake.tokens = 4  # the short request's answer, where it fails over from plain
        with contextlib.suppress(openai.APIError):  # the short request, which plain refuses
            await chat(client, MODEL, max_tokens=4)
        with pytest.raises(openai.APIError, match="no backend could go on with the answer"):
            await answer
        assert rt.metrics.registry.get_sample_value("specgate_upstream_errors_total", {"backend": "eagle", "kind": "move_failed"}) == 1
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}


async def test_a_handed_over_answer_reads_as_one_from_the_backend_it_goes_on_on(sims: tuple[str, str], tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    policy = HandingOverPolicy()
    async with gateway(*sims, access_log=log, policy=policy) as (rt, client):
        model = served_model(sims)
        reference, reference_usage, _ = await chat(client, model, route="eagle")  # forced: never handed over
        text, usage, chunks = await chat(client, model)
        assert moves(rt, "plain", "eagle", "handover") == 1 and moves(rt, "plain", "eagle") == 0
        # It teaches what EAGLE did after the handover: its own tokens, chunks and decode, the whole answer's
        # output, no prompt (EAGLE was given it with the first token); the unmoved one teaches its prompt.
        unmoved, handed = policy.learned
        assert (unmoved.backend, unmoved.given, unmoved.output_tokens) == ("eagle", 0, LIMIT) and unmoved.prompt_tokens > 0
        assert (handed.backend, handed.output_tokens, handed.prompt_tokens, handed.cached_tokens) == ("eagle", LIMIT, 0, 0)
        assert 1 <= handed.given < LIMIT and handed.decode_seconds > 0.0
        content = [c for c in chunks if c.choices and c.choices[0].delta.content]
        assert handed.token_chunks == len(content) - 1  # plain's first token event is not EAGLE's
        assert text == reference
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference_usage.prompt_tokens, reference_usage.completion_tokens)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}
        # An answer that cannot go on elsewhere (not streamed) starts where it would have been handed over to.
        whole = await client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=LIMIT)
        assert whole.headers["x-specgate-backend"] == "eagle" and whole.parse().choices[0].message.content == reference
        assert moves(rt, "plain", "eagle", "handover") == 1
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    handed = [(line["backend"], line["completion_tokens"]) for line in lines if line["moved_from"] == "plain"]
    assert handed == [("eagle", LIMIT)]


async def test_a_handover_nobody_can_take_goes_on_where_it_started(sims: tuple[str, str]) -> None:
    """EAGLE is listed ready but refuses connections: plain, which gave the first token, goes on with the
    answer, whole; while EAGLE is known down, requests are not handed over to it at all."""
    async with gateway(refused_url(), sims[1], policy=HandingOverPolicy()) as (rt, client):
        model = served_model(sims)
        reference, _, _ = await chat(client, model, route="plain")
        rt.pool["eagle"].health = Health.READY  # as the last poll saw it
        text, usage, _ = await chat(client, model)
        assert text == reference and usage.completion_tokens == LIMIT
        assert moves(rt, "plain", "plain", "handover") == 1  # the continuation EAGLE refused went on on plain
        rt.pool["eagle"].health = Health.DOWN
        again, _, _ = await chat(client, model)
        assert again == reference and moves(rt, "plain", "plain", "handover") == 1
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}


async def test_a_stream_left_running_when_another_ends_goes_on_where_the_policy_drains_it(sims: tuple[str, str]) -> None:
    policy = DrainingPolicy()
    async with gateway(*sims, policy=policy) as (rt, client):
        model = served_model(sims)
        reference, reference_usage, _ = await chat(client, model, route="plain")  # forced: never moved
        assert policy.marks == []  # no stream was running when it ended: no look
        answer = asyncio.ensure_future(chat(client, model))
        await until(lambda: streaming_on(rt, "plain", 5), "the answer streams on plain")
        await chat(client, model, max_tokens=4)  # ends while the answer streams: the policy's look moves it
        text, usage, chunks = await answer
        assert moves(rt, "plain", "eagle", "drain") == 1 and moves(rt, "plain", "eagle") == 0
        assert len(policy.marks) == 1
        assert text == reference
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference_usage.prompt_tokens, reference_usage.completion_tokens)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        assert {b.name: b.inflight for b in rt.pool} == {"eagle": 0, "plain": 0}
