"""SIGTERM to a one-worker `specgate serve` with requests in flight that outlast its drain timeout.

New requests get 503 `shutting_down` as soon as it drains, /ready turns 503, and when the drain
timeout is over the requests still running end in an answer the client can act on: a stream with
an error event and `[DONE]`, a non-streamed request with a 503, never a cut connection. (The same
under load, and with two workers: tests/reliability/test_shutdown.py.)
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from backends.testbed import SimFactory
from tests.reliability.stack import Stack, exchange, running_stack, until

pytestmark = pytest.mark.timeout(120)

DRAIN_TIMEOUT = 1.0


async def test_requests_outlasting_the_drain_end_with_a_503_or_an_error_event(sims: SimFactory) -> None:
    gateway = {"server": {"drain_timeout": DRAIN_TIMEOUT}}
    async with running_stack(sims, time_scale=0.1, gateway=gateway, workers=1) as stack:
        url = stack.url + "/v1/chat/completions"
        endless = 100_000  # tokens: minutes at this time scale
        stream = asyncio.create_task(exchange(stack.session, url, stack.chat(endless, stream=True)))
        whole = asyncio.create_task(exchange(stack.session, url, stack.chat(endless, stream=False)))
        await until(lambda: _inflight_is(stack, 2), 10, "both requests in flight")

        signalled_at = time.monotonic()
        stack.gw.proc.send_signal(signal.SIGTERM)
        await until(lambda: _ready_status(stack, 503), 10, "/ready answers 503")
        refused = await exchange(stack.session, url, stack.chat(4, stream=False))
        streamed, waited = await asyncio.wait_for(asyncio.gather(stream, whole), 30)
        code = await asyncio.to_thread(stack.gw.proc.wait, 30)

    assert refused.status == 503 and refused.error is not None and refused.error["code"] == "shutting_down", refused
    assert streamed.status == 200 and streamed.clean_error, streamed  # an error event, then [DONE] and nothing else
    assert streamed.error is not None and streamed.error["code"] == "shutting_down"
    assert waited.status == 503 and waited.clean_error and waited.error is not None and waited.error["code"] == "shutting_down"
    for outcome in (streamed, waited):  # ended by the drain timeout, not by the requests' own minutes
        assert outcome.ended_at is not None and DRAIN_TIMEOUT * 0.9 <= outcome.ended_at - signalled_at < 30
    assert code == 0


async def _inflight_is(stack: Stack, count: int) -> bool:
    return await stack.inflight() == count


async def _ready_status(stack: Stack, status: int) -> bool:
    async with stack.session.get(stack.url + "/ready") as resp:
        return resp.status == status
