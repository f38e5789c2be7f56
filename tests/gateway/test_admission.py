"""Admission with several workers: reading the gateway's counts, deciding and counting the request are one step."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.config import BackendConfig, Settings
from gateway.errors import OpenAIError
from gateway.metrics import GatewayMetrics
from gateway.policies.static import ThresholdPolicy
from gateway.pool.backends import Health
from gateway.pool.board import BoardSpec, LoadBoard
from gateway.proxy.admission import admit, fail_over
from gateway.proxy.job import ProxyJob
from gateway.runtime import Runtime

NAMES = ("eagle", "plain")
T = TypeVar("T")


@pytest.fixture
def boards() -> Iterator[list[LoadBoard]]:
    """The parent's board and two workers' views of it."""
    owner = LoadBoard.create(2, len(NAMES))
    views = [owner] + [LoadBoard(owner.spec, w) for w in range(2)]
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


def _held(spec: BoardSpec, lock: str = "routing") -> bool:
    """Whether some open file holds the board's lock `lock` (asked with a file of our own, not waiting)."""
    fd = os.open(os.path.join(spec.locks, lock), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _waiting_in(call: Callable[[], T], spec: BoardSpec) -> tuple[threading.Thread, list[T]]:
    """Run `call` in a thread and return once the kernel shows it waiting for the board's routing lock."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    inode = f":{os.stat(os.path.join(spec.locks, 'routing')).st_ino} "
    deadline = time.monotonic() + 30
    while not any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()):
        assert thread.is_alive() and time.monotonic() < deadline, "the call did not wait for the lock"
        time.sleep(0.001)
    return thread, out


def test_a_worker_decides_only_once_the_others_decision_is_counted(boards: list[LoadBoard]) -> None:
    first, second = _worker(boards[1]), _worker(boards[2])
    assert admit(first, _job()).backend.name == "eagle"  # one in flight: below the threshold of 2
    with boards[2].routing:  # the second worker is mid-decision: it read 1 in flight too
        thread, out = _waiting_in(lambda: admit(first, _job()), boards[0].spec)
        assert first.pool.total_inflight == 1  # no decision on counts about to change
        held = second.pool.acquire("eagle")  # the second worker's decision: eagle, at 1 in flight
    thread.join(30)
    assert out[0].backend.name == "plain"  # it read 2 in flight: as one process would have routed
    assert first.pool.total_inflight == second.pool.total_inflight == 3
    for slot in (held, out[0]):
        slot.release()
    assert not _held(boards[0].spec)  # admit gave the lock back


def test_the_in_flight_limit_is_the_gateways(boards: list[LoadBoard]) -> None:
    first, second = _worker(boards[1], max_inflight=2), _worker(boards[2], max_inflight=2)
    slots = [admit(first, _job()), admit(second, _job())]
    for rt in (first, second):
        with pytest.raises(OpenAIError) as info:
            admit(rt, _job())
        assert info.value.status == 429
    for slot in slots:
        slot.release()
    assert not _held(boards[0].spec)  # a refusal gives the lock back too


def test_a_failover_waits_for_the_lock_and_moves_the_slot(boards: list[LoadBoard]) -> None:
    first = _worker(boards[1])
    slot = admit(first, _job())
    assert slot.backend.name == "eagle"
    first.pool["eagle"].health = Health.DOWN
    first.pool.publish_health(first.pool["eagle"])
    first.pool.publish_cards()  # the decision reads them under the board's other lock: no deadlock
    with boards[2].routing:
        thread, out = _waiting_in(lambda: fail_over(first, _job(), slot, "eagle"), boards[0].spec)
        assert slot.backend.name == "eagle"
    thread.join(30)
    assert out == [True] and slot.backend.name == "plain"
    slot.release()
    assert first.pool.total_inflight == 0


def _hold_and_wait(spec: BoardSpec, lock: str, held: Event) -> None:
    board = LoadBoard(spec, 1)
    (board.routing if lock == "routing" else board._records).__enter__()
    held.set()
    time.sleep(60)  # killed long before


@pytest.mark.parametrize("lock", ["routing", "records"])
def test_a_worker_killed_holding_a_lock_does_not_keep_it(boards: list[LoadBoard], lock: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()
    proc = ctx.Process(target=_hold_and_wait, args=(boards[0].spec, lock, held))
    proc.start()
    try:
        assert held.wait(30)
        assert _held(boards[0].spec, lock)
    finally:
        proc.kill()
        proc.join(30)
    assert not _held(boards[0].spec, lock)  # the kernel let go of the dead worker's lock
    boards[1].publish((0.0, 10.0, 0.1, 0.5, 1.0, 1.0, 5.0, 100.0, 0.0, 0.0, 0.0))  # a completion is published: nobody waits forever
    assert boards[2].unread()[-1][1] == 10.0
