"""A backend that accepts requests and never answers, while other traffic keeps flowing.

The first-byte timeout fires and the client gets a 504 OpenAI error; a stream already running
there ends with an SSE error event when the idle timeout fires; the backend is marked unhealthy
and receives nothing more until a /health probe passes; the other backend's traffic all succeeds.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from backends.testbed import SimFactory
from tests.reliability.stack import (
    Outcome,
    Stack,
    closed_loop,
    exchange,
    running_stack,
    until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

FIRST_BYTE = 1.0
IDLE = 2.0
GATEWAY = {
    # spill with a high cap prefers eagle for every request, so avoiding it is the health state's doing.
    "policy": {"name": "spill", "eagle_max_inflight": 48},
    "health": {"ready_interval": 0.5, "ready_timeout": 0.5, "health_timeout": 1.0},
    "timeouts": {"first_byte": FIRST_BYTE, "idle": IDLE},
}
TO_EAGLE = {"x-specgate-route": "eagle"}
TO_PLAIN = {"x-specgate-route": "plain"}


@pytest.mark.parametrize("workers", [1, 2])
async def test_hung_backend_times_out_is_avoided_and_spares_other_traffic(
    sims: SimFactory, record_property: pytest.RecordProperty, workers: int
) -> None:
    async with running_stack(sims, time_scale=1.0, gateway=GATEWAY, workers=workers) as stack:
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)
        url = stack.url + "/v1/chat/completions"
        background: list[Outcome] = []
        stop = asyncio.Event()
        plain_load = asyncio.create_task(
            closed_loop(stack, 8, lambda i: stack.chat(16, stream=i % 2 == 0), stop, background, TO_PLAIN)
        )
        # A long stream on eagle, running when the hang starts.
        running = asyncio.create_task(exchange(stack.session, url, stack.chat(5000, stream=True), TO_EAGLE))
        try:
            await until(lambda: _running_on(stack, "eagle"), 10, "a stream runs on eagle")
            before = await exchange(stack.session, url, stack.chat(4, stream=False))
            hung_at = time.monotonic()
            await stack.fault(stack.eagle, kind="hang")

            started = time.monotonic()
            with pytest.raises(openai.InternalServerError) as info:
                await client.chat.completions.create(
                    model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                    extra_headers=TO_EAGLE,
                )
            timed_out_after = time.monotonic() - started
            state_after = (await stack.status())["eagle"]["state"]
            routed = [await exchange(stack.session, url, stack.chat(4, stream=False)) for _ in range(5)]
            cut = await running
            cut_after = cut.ended_at - hung_at  # type: ignore[operator]

            await stack.fault(stack.eagle, kind="clear")
            await until(lambda: _state_is(stack, "eagle", "ready"), 10, "eagle back after a passing /health")
        finally:
            stop.set()
            await plain_load
        await until(lambda: _no_inflight(stack), 5, "in-flight back to 0")

    record_property("first_byte_timeout_s", FIRST_BYTE)
    record_property("hung_request_504_after_s", round(timed_out_after, 2))
    record_property("hung_stream_ended_after_s", round(cut_after, 2))
    record_property("other_traffic_requests", len(background))
    record_property("other_traffic_failed", sum(1 for o in background if not o.completed))

    assert before.completed and before.backend == "eagle"
    assert info.value.status_code == 504
    assert set(info.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    assert info.value.body["code"] == "upstream_timeout"  # type: ignore[index]
    assert FIRST_BYTE <= timed_out_after < FIRST_BYTE + 5
    assert state_after == "failing"
    assert [o.backend for o in routed] == ["plain"] * 5 and all(o.completed for o in routed)
    # The stream cut by the hang ends cleanly once the idle timeout fires.
    assert cut.clean_error and cut.error["code"] == "idle_timeout", cut  # type: ignore[index]
    assert IDLE <= cut_after < IDLE + 5
    assert background and all(o.completed and o.backend == "plain" for o in background), [o for o in background if not o.completed][:3]
    # Traffic kept flowing on plain during the whole hang, not only before and after.
    assert any(hung_at < o.ended_at < hung_at + FIRST_BYTE for o in background)  # type: ignore[operator]


async def _running_on(stack: Stack, backend: str) -> bool:
    return any(r["state"] == "running" for r in await stack.sim_requests(stack.sim(backend)))


async def _state_is(stack: Stack, backend: str, state: str) -> bool:
    return (await stack.status())[backend]["state"] == state


async def _no_inflight(stack: Stack) -> bool:
    return await stack.inflight() == 0
