"""Admission with several workers: reading the gateway's counts, deciding and counting the request are one step."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event, Lock

import pytest

from gateway.admission import admit, fail_over
from gateway.board import BoardSpec, LoadBoard
from gateway.config import BackendConfig, Settings
from gateway.errors import OpenAIError
from gateway.metrics import GatewayMetrics
from gateway.policies import ThresholdPolicy
from gateway.pool import Health
from gateway.proxy_job import ProxyJob
from gateway.runtime import Runtime

NAMES = ("eagle", "plain")


@pytest.fixture
def boards() -> Iterator[list[LoadBoard]]:
    """The parent's board and two workers' views of it."""
    owner = LoadBoard.create(2, len(NAMES), multiprocessing.get_context("spawn").Lock())
    views = [owner] + [LoadBoard(owner.spec, w, owner._lock) for w in range(2)]
    yield views
    for view in views[1:]:
        view.close()
    owner.close(unlink=True)


def _worker(board: LoadBoard, max_inflight: int = 64) -> Runtime:
    backends = [BackendConfig(name=name, url=f"http://{name}", speculative=name == "eagle") for name in NAMES]
    settings = Settings.model_validate({"backends": [b.model_dump() for b in backends], "limits": {"max_inflight": max_inflight}})
    rt = Runtime(settings, backends, ThresholdPolicy(2), GatewayMetrics(), board=board, poll_health=False)
    for backend in rt.pool:
        backend.health = Health.READY
        rt.pool.publish_health(backend)
    return rt


def _job() -> ProxyJob:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return ProxyJob("chat", "/v1/chat/completions", body, False, False, None, "req", time.monotonic())


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_worker_decides_only_once_the_others_decision_is_counted(boards: list[LoadBoard]) -> None:
    first, second = _worker(boards[1]), _worker(boards[2])
    assert (await admit(first, _job())).backend.name == "eagle"  # one in flight: below the threshold of 2
    assert boards[2].try_hold()  # the second worker is mid-decision: it read 1 in flight too
    waiting = asyncio.create_task(admit(first, _job()))
    await _turns(20)
    assert not waiting.done() and first.pool.total_inflight == 1  # no decision on counts about to change
    held = second.pool.acquire("eagle")  # the second worker's decision: eagle, at 1 in flight
    boards[2].let_go()
    slot = await asyncio.wait_for(waiting, 5)
    assert slot.backend.name == "plain"  # it read 2 in flight: as one process would have routed
    assert first.pool.total_inflight == second.pool.total_inflight == 3
    for each in (held, slot):
        each.release()
    assert boards[1].try_hold()  # admit gave the lock back
    boards[1].let_go()


async def test_the_in_flight_limit_is_the_gateways(boards: list[LoadBoard]) -> None:
    first, second = _worker(boards[1], max_inflight=2), _worker(boards[2], max_inflight=2)
    slots = [await admit(first, _job()), await admit(second, _job())]
    for rt in (first, second):
        with pytest.raises(OpenAIError) as info:
            await admit(rt, _job())
        assert info.value.status == 429
    for slot in slots:
        slot.release()
    assert boards[1].try_hold()  # a refusal gives the lock back too
    boards[1].let_go()


async def test_a_request_waiting_for_the_lock_can_be_cancelled(boards: list[LoadBoard]) -> None:
    first = _worker(boards[1])
    assert boards[2].try_hold()
    waiting = asyncio.create_task(admit(first, _job()))
    await _turns(5)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    boards[2].let_go()
    assert first.pool.total_inflight == 0 and boards[1].try_hold()  # nothing taken, the lock not held
    boards[1].let_go()


async def test_a_failover_waits_for_the_lock_and_moves_the_slot(boards: list[LoadBoard]) -> None:
    first = _worker(boards[1])
    slot = await admit(first, _job())
    assert slot.backend.name == "eagle"
    first.pool["eagle"].health = Health.DOWN
    first.pool.publish_health(first.pool["eagle"])
    first.pool.publish_cards()  # the decision reads them under the board's other lock: no deadlock
    assert boards[2].try_hold()
    moving = asyncio.create_task(fail_over(first, _job(), slot, "eagle"))
    await _turns(5)
    assert not moving.done() and slot.backend.name == "eagle"
    boards[2].let_go()
    assert await asyncio.wait_for(moving, 5)
    assert slot.backend.name == "plain"
    slot.release()
    assert first.pool.total_inflight == 0


def _hold_and_wait(spec: BoardSpec, lock: Lock, held: Event) -> None:
    attached = LoadBoard(spec, 1, lock)
    assert attached.try_hold()
    held.set()
    time.sleep(60)  # killed long before


def test_a_worker_killed_holding_the_lock_does_not_keep_it(boards: list[LoadBoard]) -> None:
    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()
    proc = ctx.Process(target=_hold_and_wait, args=(boards[0].spec, boards[0]._lock, held))
    proc.start()
    try:
        assert held.wait(30)
        assert not boards[2].try_hold()
    finally:
        proc.kill()
        proc.join(30)
    assert boards[2].try_hold()  # the kernel let go of the dead worker's lock
    boards[2].let_go()
