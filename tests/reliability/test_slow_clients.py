"""Thousands of slow clients against `specgate serve` while real requests are served (issue 31's bar).

3,000 slowloris connections (a request line and a header, then nothing) and 200 slow POSTs (a
complete head declaring 100,000 bytes, one byte of it; half to the fast path, half to a FastAPI
route), with both client timeouts at 5 s: the gateway closes every one of them (408) within 15 s;
chat completions sent one after another from the first hostile connection to the last one's
close (through the timeouts' firing) each answer 200 within 1 s, and a streamed one through the
`openai` client completes; afterwards nothing is in flight and `client_connections` is back to its
idle value. With one worker and with two.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from backends.fdlimit import raise_nofile_limit
from backends.testbed import SimFactory
from tests.reliability.attack import SLOW_HEAD, closed, connection_counts, hold_open, slow_body
from tests.reliability.stack import Outcome, Stack, exchange, running_stack, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

SLOW_HEADS, SLOW_BODIES = 3000, 200
TIMEOUT = 5.0
CLOSED_WITHIN = 15.0
ANSWERED_WITHIN = 1.0
GATEWAY = {"limits": {"client_header_timeout_seconds": TIMEOUT, "client_body_timeout_seconds": TIMEOUT}}


@pytest.mark.parametrize("workers", [1, 2])
async def test_slow_clients_are_all_closed_while_real_requests_are_served(
    sims: SimFactory, workers: int, record_property: pytest.RecordProperty
) -> None:
    raise_nofile_limit()  # 3,200 sockets in this process
    async with running_stack(sims, time_scale=0.1, gateway=GATEWAY, workers=workers) as stack:
        # Each sample counts its own connection, and the stack's session keeps one alive on one of the
        # workers (30 s): with two, samples that all reach the other one would read 1 where it reads 2.
        idle = max(*await connection_counts(stack.url, 8), 2)
        requests = [SLOW_HEAD] * SLOW_HEADS
        requests += [slow_body(path) for path in ("/v1/chat/completions", "/v1/responses") for _ in range(SLOW_BODIES // 2)]
        attacked = asyncio.Event()
        chats = asyncio.create_task(_chats_until(stack, attacked))
        held = await hold_open(stack.url, requests)
        opened_at = time.monotonic()
        assert all(h.closed_at is None for h in held), "a slow client was closed before its timeout"

        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=16, stream=True
        )
        chunks = [chunk async for chunk in stream]
        legit_done = time.monotonic()
        await client.close()
        assert chunks[-1].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(h.closed_at is None for h in held), "the legit requests did not run during the attack"

        await closed(held, CLOSED_WITHIN)
        attacked.set()
        outcomes = await chats
        assert outcomes and all(o.completed for o in outcomes), [o for o in outcomes if not o.completed][:3]
        latency = max(o.ended_at - o.sent_at for o in outcomes if o.ended_at is not None)
        assert latency < ANSWERED_WITHIN, f"a chat completion during the attack took {latency:.3f} s"
        waits = [h.closed_at - h.sent_at for h in held if h.closed_at is not None]
        assert min(waits) >= TIMEOUT * 0.9  # no timer fires early
        assert max(waits) <= CLOSED_WITHIN
        assert {h.status for h in held} == {408}

        assert await stack.inflight() == 0
        # Every worker back to idle: consecutive samples on new connections, any worker answering.
        await until(lambda: _idle(stack.url, idle), 10, f"client_connections back to {idle}")
        assert await stack.metric("specgate_client_timeouts_total", phase="head") == SLOW_HEADS
        assert await stack.metric("specgate_client_timeouts_total", phase="body") == SLOW_BODIES
        record_property("workers", workers)
        record_property("opened_in_s", round(opened_at - min(h.sent_at for h in held), 2))
        record_property("legit_chats", len(outcomes))
        record_property("legit_chat_max_s", round(latency, 3))
        record_property("legit_before_first_close_s", round(min(h.closed_at or 0 for h in held) - legit_done, 2))
        record_property("closed_after_s_min_max", f"{min(waits):.2f}/{max(waits):.2f}")
        record_property("client_connections_idle", idle)


async def _chats_until(stack: Stack, done: asyncio.Event) -> list[Outcome]:
    """Chat completions one after another until `done` is set."""
    outcomes = []
    while not done.is_set():
        outcomes.append(await exchange(stack.session, stack.url + "/v1/chat/completions", stack.chat(8, stream=False)))
    return outcomes


async def _idle(url: str, idle: int) -> bool:
    return all(count <= idle for count in await connection_counts(url, 8))
