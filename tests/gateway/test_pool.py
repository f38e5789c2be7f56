"""In-flight accounting: exact, never negative, released once, and the load integral."""

from __future__ import annotations

import asyncio

from gateway.pool import Backend, Health, Pool


def make_pool() -> Pool:
    return Pool([Backend("eagle", "http://e", True, health=Health.READY), Backend("plain", "http://p", False)])


def test_slot_release_is_idempotent_and_counts_are_exact() -> None:
    pool = make_pool()
    a, b = pool.acquire("eagle"), pool.acquire("eagle")
    c = pool.acquire("plain")
    assert (pool["eagle"].inflight, pool["plain"].inflight, pool.total_inflight) == (2, 1, 3)
    a.release()
    a.release()
    assert pool["eagle"].inflight == 1
    b.release()
    c.release()
    c.release()
    assert pool.total_inflight == 0 and pool["eagle"].inflight == 0
    assert pool["eagle"].served == 2


def test_snapshot_reflects_availability_and_load() -> None:
    pool = make_pool()
    pool.acquire("plain")
    snap = pool.snapshot()
    assert snap.speculative.available and not snap.plain.available
    assert snap.total_inflight == 1 and snap.get("plain").inflight == 1


def test_load_area_integrates_inflight_over_time() -> None:
    backend = Backend("eagle", "http://e", True)
    backend._load_since = 100.0
    backend.inflight = 0
    assert backend.load_area(110.0) == 0.0
    backend.inflight = 3
    assert backend.load_area(110.0) == 30.0


async def test_wait_idle() -> None:
    pool = make_pool()
    slot = pool.acquire("eagle")
    assert not await pool.wait_idle(0.01)
    asyncio.get_running_loop().call_soon(slot.release)
    assert await pool.wait_idle(5)
