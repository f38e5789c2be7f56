"""The per-client connection cap: client addresses as keys, and the counts on one process's board and
on the workers' shared board (exact across processes)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import pytest

from gateway.edge.client_cap import ClientCap, client_key
from gateway.pool.board import CLIENT_WAYS, BoardSpec, LoadBoard, LocalBoard, client_bucket

V4 = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 7])


def test_a_client_is_its_ip_address_whatever_its_port() -> None:
    assert client_key(("10.0.0.7", 5000)) == client_key(("10.0.0.7", 6000)) == V4
    assert client_key(("::ffff:10.0.0.7", 1, 0, 0)) == V4  # the same client over an IPv6 socket
    assert client_key(("fe80::1%eth0", 1, 0, 2)) == client_key(("fe80::1", 1, 0, 0))
    assert client_key(("2001:db8::1", 1, 0, 0)) != client_key(("2001:db8::2", 1, 0, 0))
    assert client_key("/run/specgate.sock") is None and client_key(None) is None  # a Unix socket: not capped


def test_a_peer_without_an_address_is_let_in_uncounted() -> None:
    refused: list[None] = []
    cap = ClientCap(LocalBoard(), 1, lambda: refused.append(None))
    releases = [cap.admit("/run/specgate.sock") for _ in range(3)]
    assert all(r is not None for r in releases) and refused == []


@pytest.fixture(params=["local", "shared"])
def views(request: pytest.FixtureRequest) -> Iterator[list[LocalBoard | LoadBoard]]:
    """Two views of one gateway's counts: one process's board twice, or two workers' views of the shared one."""
    if request.param == "local":
        board = LocalBoard()
        yield [board, board]
        return
    owner = LoadBoard.create(2, 2)
    workers = [LoadBoard(owner.spec, w) for w in range(2)]
    yield list(workers)
    for view in workers:
        view.close()
    owner.close(unlink=True)


def test_the_cap_counts_every_view_and_a_release_makes_room(views: list[LocalBoard | LoadBoard]) -> None:
    a, b = views
    first = a.admit_client(V4, 2)
    second = b.admit_client(V4, 2)
    assert first is not None and second is not None
    assert a.admit_client(V4, 2) is None and b.admit_client(V4, 2) is None
    other = b.admit_client(client_key(("10.0.0.8", 1)) or b"", 2)  # another client has its own count
    assert other is not None
    first()
    again = b.admit_client(V4, 2)
    assert again is not None and a.admit_client(V4, 2) is None


def test_a_dead_workers_connections_are_uncounted() -> None:
    owner = LoadBoard.create(2, 1)
    worker = LoadBoard(owner.spec, 0)
    try:
        assert worker.admit_client(V4, 1) is not None
        assert worker.admit_client(V4, 1) is None
        owner.clear_worker(0, 0.0)  # the parent replaces a dead worker: its sockets died with it
        assert worker.admit_client(V4, 1) is not None
    finally:
        worker.close()
        owner.close(unlink=True)


def test_a_client_whose_bucket_is_full_is_let_in_uncounted() -> None:
    owner = LoadBoard.create(1, 1)
    worker = LoadBoard(owner.spec, 0)
    try:
        # Addresses until one bucket holds CLIENT_WAYS of them, then one more for that bucket.
        by_bucket: dict[int, list[bytes]] = {}
        for n in range(1 << 20):
            key = bytes(12) + n.to_bytes(4, "big")
            bucket = client_bucket(key, owner.spec.salt)
            by_bucket.setdefault(bucket, []).append(key)
            if len(by_bucket[bucket]) > CLIENT_WAYS:
                break
        *held, extra = by_bucket[bucket]
        releases = [worker.admit_client(key, 1) for key in held]
        assert all(r is not None for r in releases)
        assert all(worker.admit_client(key, 1) is None for key in held)  # each counted
        assert worker.admit_client(extra, 1) is not None and worker.admit_client(extra, 1) is not None  # uncounted
        releases[0]()  # a way comes free: the next one counts again
        assert worker.admit_client(extra, 1) is not None and worker.admit_client(extra, 1) is None
    finally:
        worker.close()
        owner.close(unlink=True)


ROUNDS = 3000


def _contend(spec: BoardSpec, worker: int, start: Event, holders: Synchronized[int], most: Synchronized[int]) -> None:
    """Admit one client's connection ROUNDS times, counting it as held from admission to release."""
    board = LoadBoard(spec, worker)
    start.wait()
    for _ in range(ROUNDS):
        release = board.admit_client(V4, 1)
        if release is None:
            continue
        with holders.get_lock():
            holders.value += 1
            most.value = max(most.value, holders.value)
        with holders.get_lock():
            holders.value -= 1
        release()
    board.close()


def test_two_worker_processes_never_admit_past_the_cap_together() -> None:
    ctx = multiprocessing.get_context("spawn")
    owner = LoadBoard.create(2, 1)
    start, holders, most = ctx.Event(), ctx.Value("i", 0), ctx.Value("i", 0)
    procs = [ctx.Process(target=_contend, args=(owner.spec, w, start, holders, most)) for w in range(2)]
    try:
        for proc in procs:
            proc.start()
        start.set()
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        assert most.value == 1  # a cap of 1 held across both processes at every moment
    finally:
        for proc in procs:
            proc.kill()
        owner.close(unlink=True)
