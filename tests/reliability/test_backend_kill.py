"""SIGKILL one backend under closed-loop load at concurrency 64, then bring it back.

Nothing that had not received a byte may fail (it is retried on the other backend, or routed
there); a chat stream of one choice cut on the dead backend goes on on the other from the text it
had (`specgate_moves_total{reason="resume"}`), and one that cannot (two choices) ends at once with an
SSE error event and `data: [DONE]`;
the gateway routes to the backend again within one health-check interval of it being ready; the
in-flight gauges end at exactly 0.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from backends.testbed import SimFactory
from tests.reliability.stack import Outcome, Stack, closed_loop, running_stack, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

CONCURRENCY = 64
READY_INTERVAL = 0.5
OUTPUT_TOKENS = 32
GATEWAY = {
    # spill keeps ~32 streams on each backend, so the kill cuts many streams mid-flight.
    "policy": {"name": "spill", "eagle_max_inflight": 32},
    "health": {"ready_interval": READY_INTERVAL},
    "timeouts": {"first_byte": 30, "idle": 10},
}


async def _state(stack: Stack, backend: str) -> str:
    return str((await stack.status())[backend]["state"])


async def _sent_after(outcomes: list[Outcome], moment: float, count: int) -> bool:
    return sum(1 for o in outcomes if o.sent_at > moment) >= count


@pytest.mark.parametrize("workers", [1, 2])
async def test_killing_a_backend_under_load_fails_only_streams_already_started(
    sims: SimFactory, record_property: pytest.RecordProperty, workers: int
) -> None:
    async with running_stack(sims, time_scale=1.0, gateway=GATEWAY, workers=workers) as stack:
        outcomes: list[Outcome] = []
        stop = asyncio.Event()

        # One request in four is not streamed: it has no byte before it completes, so none may fail.
        # One in four streams two choices: no other backend can go on with it, so a cut one fails.
        def body(i: int) -> bytes:
            return stack.chat(OUTPUT_TOKENS, stream=i % 4 != 0, **({"n": 2} if i % 4 == 1 else {}))

        load = asyncio.create_task(closed_loop(stack, CONCURRENCY, body, stop, outcomes))
        try:
            await until(lambda: _eagle_streaming(stack, outcomes), 20, "eagle has streams in progress")
            killed_at = time.monotonic()
            stack.eagle.signal(signal.SIGKILL)
            await asyncio.to_thread(stack.eagle.wait, 5)
            await until(lambda: _is(stack, "eagle", "down"), 5, "the gateway marks eagle down")
            down_after = time.monotonic() - killed_at
            # Two rounds of the closed loop on plain alone.
            await until(lambda: _sent_after(outcomes, killed_at, 2 * CONCURRENCY), 60, "load carries on on plain")

            await stack.restart("eagle")
            ready_at = time.monotonic()
            await until(lambda: _is(stack, "eagle", "ready"), 5, "the gateway sees eagle ready again")
            recovered_after = time.monotonic() - ready_at
            await until(lambda: _served_by(outcomes, "eagle", ready_at), 20, "eagle serves requests again")
        finally:
            stop.set()
            await load

        await until(lambda: _gauges_zero(stack), 5, "in-flight gauges back to 0")
        upstream_cut = sum(
            [await stack.metric("specgate_upstream_errors_total", backend="eagle", kind=kind) for kind in ("disconnected", "truncated")]
        )
        resumed = await stack.metric("specgate_moves_total", **{"from": "eagle", "to": "plain", "reason": "resume"})
        inflight = {b: await stack.metric("specgate_inflight_requests", backend=b) for b in ("eagle", "plain")}
        retried = await stack.metric("specgate_route_decisions_total", reason="failover_retry")

    lost = [o for o in outcomes if o.lost]
    cut = [o for o in outcomes if o.clean_error]
    # The gateway answers 200 only once the backend has: a request that failed before any upstream
    # byte shows an error status. The client's clock cannot tell, since a relay under way at the kill
    # reaches the client after it.
    failed_before_a_byte = [o for o in outcomes if not o.completed and o.status != 200]
    cut_end_ms = [1000 * (o.ended_at - killed_at) for o in cut]  # type: ignore[operator]
    record_property("requests", len(outcomes))
    record_property("streams_cut", len(cut))
    record_property("streams_resumed", int(resumed))
    record_property("retried_on_the_other_backend", int(retried))
    record_property("failed_without_a_byte", len(failed_before_a_byte))
    record_property("cut_stream_end_after_kill_ms_max", round(max(cut_end_ms, default=0.0), 1))
    record_property("down_detected_s", round(down_after, 3))
    record_property("routing_recovered_s", round(recovered_after, 3))

    assert not lost, f"{len(lost)} requests got neither a response nor a clean error, e.g. {lost[0]}"
    assert cut and resumed, "the kill cut no stream of each kind in progress; the test did not exercise both"
    for o in cut:
        # Only streams that were receiving bytes from eagle may fail, and each ends with error + [DONE].
        assert o.backend == "eagle" and o.status == 200 and o.events >= 2, o
        assert o.headers_at is not None and o.headers_at <= killed_at + 1.0, o
        assert o.error is not None and o.error["type"] == "server_error"
    assert max(cut_end_ms) < 1000, f"a cut stream took {max(cut_end_ms):.0f} ms to end"
    assert upstream_cut == len(cut) + resumed
    assert all(o.completed for o in outcomes if not o.clean_error)
    assert not failed_before_a_byte, failed_before_a_byte[0]
    assert all(o.backend == "plain" for o in outcomes if killed_at + 0.05 < o.sent_at and o.ended_at < ready_at)  # type: ignore[operator]
    assert down_after <= READY_INTERVAL + 0.5
    assert recovered_after <= READY_INTERVAL + 0.5, f"routing took {recovered_after:.2f} s to use eagle again"
    assert inflight == {"eagle": 0.0, "plain": 0.0}


async def _eagle_streaming(stack: Stack, outcomes: list[Outcome]) -> bool:
    # A full round done (so streams of every age exist), and eagle holding at least half its share.
    return len(outcomes) >= CONCURRENCY and (await stack.status())["eagle"]["inflight"] >= 16


async def _is(stack: Stack, backend: str, state: str) -> bool:
    return await _state(stack, backend) == state


async def _served_by(outcomes: list[Outcome], backend: str, since: float) -> bool:
    return any(o.backend == backend and o.completed and o.sent_at > since for o in outcomes)


async def _gauges_zero(stack: Stack) -> bool:
    return await stack.metric("specgate_inflight_requests") == 0
