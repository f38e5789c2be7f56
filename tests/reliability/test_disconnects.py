"""1,000 clients that leave at random points: before the response headers, after the first token, mid-stream.

Afterwards the gateway holds no in-flight slot, and the simulated backends show every request they
received as aborted (none ran to completion for a client that was gone). Half of the clients send
their own `rid`; for the others the gateway's `x-request-id` is the upstream rid.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass

import aiohttp
import pytest

from backends.testbed import SimFactory
from loadtest.sse import SSEDecoder
from tests.reliability.stack import JSON, Stack, running_stack, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

CLIENTS = 1000
FIRST_TOKEN_DELAY = 1.0  # every request waits this long (wall clock) before its first token
OUTPUT_TOKENS = 400  # far more than any client reads, so no request can finish
ARRIVALS = 4.0  # seconds over which the clients arrive (~250/s), each at a random moment


@dataclass
class Leaver:
    """One client and where it leaves."""

    index: int
    arrives: float  # seconds after the first client
    point: str  # "before_headers", "after_first_token" or "mid_stream"
    stream: bool
    rid: str | None  # sent in the body, or None to rely on the gateway's x-request-id
    delay: float = 0.0  # before_headers: seconds after sending
    chunks: int = 0  # mid_stream: content chunks read before leaving
    seen_id: str | None = None  # x-request-id, when the headers arrived
    late: bool = False  # before_headers, but a loaded event loop let the first token arrive first


def _leavers(seed: int) -> list[Leaver]:
    rng = random.Random(seed)
    out = []
    for i in range(CLIENTS):
        point = ("before_headers", "after_first_token", "mid_stream")[i % 3]
        rid = f"leaver-{i}" if i % 2 == 0 else None
        stream = point != "before_headers" or rng.random() < 0.5
        leaver = Leaver(i, rng.uniform(0, ARRIVALS), point, stream=stream, rid=rid)
        leaver.delay = rng.uniform(0.01, 0.6 * FIRST_TOKEN_DELAY)
        leaver.chunks = rng.randint(2, 20)
        out.append(leaver)
    return out


async def _run(stack: Stack, leaver: Leaver) -> None:
    await asyncio.sleep(leaver.arrives)
    extra = {"rid": leaver.rid} if leaver.rid else {}
    body = stack.chat(OUTPUT_TOKENS, stream=leaver.stream, **extra)
    url = stack.url + "/v1/chat/completions"
    if leaver.point == "before_headers":
        request = asyncio.ensure_future(stack.session.post(url, data=body, headers=JSON))
        await asyncio.sleep(leaver.delay)
        request.cancel()  # aiohttp closes the connection of a cancelled request
        try:
            resp = await request
        except asyncio.CancelledError:
            return
        # The client's timer fired late on a loaded machine: it leaves right after the headers instead.
        assert resp.status == 200, await resp.text()
        leaver.late, leaver.seen_id = True, resp.headers["x-request-id"]
        resp.close()
        return
    async with stack.session.post(url, data=body, headers=JSON) as resp:
        assert resp.status == 200, await resp.text()
        leaver.seen_id = resp.headers["x-request-id"]
        wanted = 1 if leaver.point == "after_first_token" else leaver.chunks
        decoder, content = SSEDecoder(), 0
        async for line in resp.content:
            data = decoder.feed(line)
            if data is not None and b'"content":"' in data and b'"content":""' not in data:
                content += 1
                if content >= wanted:
                    break
        resp.close()  # leave: the connection is closed, not returned to the pool


async def _all_settled(stack: Stack) -> list[dict[str, object]] | None:
    records = [r for sim in (stack.eagle, stack.plain) for r in await stack.sim_requests(sim)]
    return records if all(r["state"] in ("finished", "aborted") for r in records) else None


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_thousand_clients_leaving_at_random_points_abort_upstream(
    sims: SimFactory, record_property: pytest.RecordProperty, workers: int
) -> None:
    leavers = _leavers(seed=8)
    gateway = {"policy": {"name": "spill", "eagle_max_inflight": 48}}
    async with running_stack(sims, time_scale=1.0, gateway=gateway, connections=0, workers=workers) as stack:
        for sim in (stack.eagle, stack.plain):
            await stack.fault(sim, kind="slow_first_token", seconds=FIRST_TOKEN_DELAY)
        results = await asyncio.gather(*(_run(stack, leaver) for leaver in leavers), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"{len(failures)} clients failed: {failures[:3]}"

        await until(lambda: _no_inflight(stack), 5, "gateway in-flight back to 0")
        records = await until(lambda: _all_settled(stack), 5, "every upstream request ended")
        inflight = {b: await stack.metric("specgate_inflight_requests", backend=b) for b in ("eagle", "plain")}
        client_gone = await stack.metric("specgate_requests_total", endpoint="chat", status="499")

    states = Counter(str(r["state"]) for r in records)
    upstream_rids = {str(r["rid"]) for r in records}
    expected = {leaver.rid or leaver.seen_id for leaver in leavers if leaver.point != "before_headers" or leaver.late}
    early = [leaver for leaver in leavers if leaver.point == "before_headers"]
    late = sum(1 for leaver in early if leaver.late)
    early_reached = sum(1 for leaver in early if leaver.rid in upstream_rids)
    record_property("clients", CLIENTS)
    record_property("upstream_requests", len(records))
    record_property("upstream_aborted", states["aborted"])
    record_property("upstream_finished", states["finished"])
    record_property("inflight_after", int(sum(inflight.values())))
    record_property("early_leavers_late", late)

    assert inflight == {"eagle": 0.0, "plain": 0.0}
    # Each early leaver leaves at least 0.4 s before its first token could come; only a stalled client
    # loop lets the headers win, and then rarely.
    assert late <= 0.05 * len(early), late
    assert states == {"aborted": len(records)}, states
    assert expected <= upstream_rids, f"{len(expected - upstream_rids)} streams never reached a backend"
    known = {leaver.rid for leaver in leavers if leaver.rid} | {leaver.seen_id for leaver in leavers if leaver.seen_id}
    # Requests whose client left before the headers carry the gateway's id, unseen by the client.
    assert len(upstream_rids - known) <= sum(1 for leaver in early if not leaver.rid)
    # Most early leavers stayed long enough for their request to reach a backend and be aborted there.
    assert early_reached >= 0.75 * sum(1 for leaver in early if leaver.rid)
    # Status 499 counts every client that left before its response ended, headers sent or not; a client
    # that left before the gateway had read its request was never a request (at most the early leavers
    # not seen upstream).
    unseen = len(early) - early_reached
    assert CLIENTS - unseen <= client_gone <= CLIENTS


async def _no_inflight(stack: Stack) -> bool:
    try:
        return await stack.inflight() == 0
    except aiohttp.ClientError:
        return False
