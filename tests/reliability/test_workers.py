"""`[server] workers = 2`: a worker killed mid-stream is replaced, and its in-flight counts are cleared.

Its clients lose their connections (the process is gone), the other worker's clients finish, the
gateway keeps serving, and the whole gateway's in-flight count returns to zero once the survivors'
streams end: nothing the dead worker held is left counted against a backend.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from backends.testbed import SimFactory
from tests.reliability.stack import Outcome, exchange, running_stack, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

STREAMS = 16
OUTPUT_TOKENS = 200  # ~4 s at time scale 1: long enough to kill a worker in the middle


def _workers(gateway_pid: int) -> list[psutil.Process]:
    """The gateway's live worker processes (a killed one is a zombie until the parent reaps it)."""
    found = []
    for child in psutil.Process(gateway_pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


async def test_a_killed_worker_is_replaced_and_its_counts_cleared(sims: SimFactory) -> None:
    async with running_stack(sims, time_scale=1.0, gateway={"health": {"ready_interval": 0.5}}, workers=2) as stack:
        first = _workers(stack.gw.proc.pid)
        assert len(first) == 2
        url = stack.url + "/v1/chat/completions"
        flights = [asyncio.create_task(exchange(stack.session, url, stack.chat(OUTPUT_TOKENS, stream=True))) for _ in range(STREAMS)]
        await until(lambda: _inflight_at_least(stack, STREAMS), 20, f"{STREAMS} streams in flight")
        port = int(stack.url.rsplit(":", 1)[1])
        victim = max(first, key=lambda worker: _clients(worker, port))  # the one holding most streams
        os.kill(victim.pid, signal.SIGKILL)
        outcomes: list[Outcome] = await asyncio.gather(*flights)
        await until(lambda: _replaced(stack.gw.proc.pid, {p.pid for p in first}), 20, "a new worker in the dead one's place")
        await until(lambda: _inflight_is(stack, 0), 10, "the gateway's in-flight count back to 0")
        after = await exchange(stack.session, url, stack.chat(8, stream=True))
        inflight_gauge = await stack.metric("specgate_inflight_requests")

    completed = sum(1 for o in outcomes if o.completed)
    assert completed < STREAMS  # the killed worker's streams were cut ...
    assert all(o.completed or o.transport_error for o in outcomes)  # ... and the others finished
    assert after.completed
    assert inflight_gauge == 0


def _clients(worker: psutil.Process, port: int) -> int:
    return sum(1 for c in worker.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)


async def _inflight_at_least(stack, count: int) -> bool:  # type: ignore[no-untyped-def]
    return await stack.inflight() >= count


async def _inflight_is(stack, count: int) -> bool:  # type: ignore[no-untyped-def]
    return await stack.inflight() == count


async def _replaced(gateway_pid: int, old: set[int]) -> bool:
    pids = {p.pid for p in _workers(gateway_pid)}
    return len(pids) == 2 and len(pids - old) == 1
