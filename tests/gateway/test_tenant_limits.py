"""Tenants' limits on the board: GCRA buckets and in-flight counts that hold for the whole gateway.

Two views of one `LoadBoard` are two workers (a worker process attaches the same way); time is
passed in, so every window is exact and nothing sleeps.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator

import pytest

from gateway.pool.board import LoadBoard, LocalBoard
from gateway.pool.tenant_limits import Lease, Limits, Quota, Refusal, TenantLimits

T0 = 1000.0  # a monotonic clock reading


@pytest.fixture
def boards() -> Iterator[list[LoadBoard]]:
    owner = LoadBoard.create(2, 1, tenants=3)
    views = [LoadBoard(owner.spec, w) for w in range(2)]
    yield views
    for view in views:
        view.close()
    owner.close(unlink=True)


def workers(boards: list[LoadBoard], *limits: Limits) -> list[TenantLimits]:
    padded = list(limits) + [Limits()] * (3 - len(limits))
    return [TenantLimits(board, padded) for board in boards]


def burst(limits: list[TenantLimits], count: int, now: float, tenant: int = 0) -> list[Lease | Refusal]:
    """`count` requests at `now`, alternating between the workers."""
    out = []
    for i in range(count):
        worker = limits[i % len(limits)]
        with worker._routing:
            out.append(worker.admit(tenant, now))
    return out


def admitted(results: list[Lease | Refusal]) -> int:
    return sum(isinstance(r, Lease) for r in results)


def test_a_burst_of_three_times_the_limit_gets_exactly_the_limit_per_window_across_workers(boards: list[LoadBoard]) -> None:
    limits = workers(boards, Limits(requests_per_minute=10))
    first = burst(limits, 30, T0)
    assert admitted(first) == 10 and all(isinstance(r, Lease) for r in first[:10])
    refused = first[10]
    assert isinstance(refused, Refusal) and refused.limit == "requests"
    assert refused.retry_after == pytest.approx(6.0)  # one request's share of the minute
    assert refused.requests == Quota(10, 0, pytest.approx(60.0))
    assert admitted(burst(limits, 30, T0 + 59.0)) == 9  # refilling at the rate: 59 s hold 9 requests
    assert admitted(burst(limits, 30, T0 + 59.0 + 60.0)) == 10  # a full minute later: the whole allowance again
    assert admitted(burst(limits, 30, T0 + 59.0 + 90.0)) == 5  # half a minute: half of it


def test_the_remaining_requests_and_reset_follow_the_bucket(boards: list[LoadBoard]) -> None:
    limits = workers(boards, Limits(requests_per_minute=5000))
    leases = burst(limits, 3, T0)
    assert [lease.requests for lease in leases] == [  # type: ignore[union-attr]
        Quota(5000, 4999, pytest.approx(0.012)),  # OpenAI's own example: 4999 left, full again in 12 ms
        Quota(5000, 4998, pytest.approx(0.024)),
        Quota(5000, 4997, pytest.approx(0.036)),
    ]
    assert all(lease.tokens is None for lease in leases)  # type: ignore[union-attr]


def test_tokens_counted_by_one_worker_refuse_the_next_request_at_another(boards: list[LoadBoard]) -> None:
    limits = workers(boards, Limits(tokens_per_minute=1000))
    with limits[0]._routing:
        lease = limits[0].admit(0, T0)
    assert isinstance(lease, Lease) and lease.tokens == Quota(1000, 1000, 0.0)
    marks: list[float] = []
    relayed = lease.metering(marks.append)
    for _ in range(300):
        relayed(T0)  # 300 chunks relayed by worker 0: one token each, so far
    assert len(marks) == 300  # the slot still marks every chunk
    lease.settle(prompt_tokens=500, completion_tokens=600)  # usage: 1100 in all, 800 more than counted
    with limits[1]._routing:
        assert isinstance(limits[1].admit(0, T0), Lease)  # worker 0 has not folded its count yet
    limits[0].fold(T0)  # its catch-up tick
    with limits[1]._routing:
        refused = limits[1].admit(0, T0 + 1.0)
    assert isinstance(refused, Refusal) and refused.limit == "tokens"
    assert refused.retry_after == pytest.approx(5.0)  # 100 tokens over the minute's 1000, at 1000/min, less the 1 s passed
    assert refused.tokens == Quota(1000, 0, pytest.approx(65.0))
    with limits[1]._routing:
        again = limits[1].admit(0, T0 + 6.5)  # the 100 tokens over the allowance have been refilled
    assert isinstance(again, Lease) and again.tokens == Quota(1000, 8, pytest.approx(59.5))


def test_settle_charges_only_what_the_chunks_left_out(boards: list[LoadBoard]) -> None:
    limits = workers(boards, Limits(tokens_per_minute=600))
    with limits[0]._routing:
        lease = limits[0].admit(0, T0)
    assert isinstance(lease, Lease)
    relayed = lease.metering(lambda now: None)
    for _ in range(10):
        relayed(T0)
    lease.settle(prompt_tokens=0, completion_tokens=4)  # fewer than the chunks counted: nothing more
    limits[0].fold(T0)
    with limits[1]._routing:
        nxt = limits[1].admit(0, T0)
    assert isinstance(nxt, Lease) and nxt.tokens == Quota(600, 590, pytest.approx(1.0))


def test_in_flight_counts_are_the_gateways_and_a_dead_workers_are_cleared(boards: list[LoadBoard]) -> None:
    limits = workers(boards, Limits(), Limits(max_inflight=2))
    held = burst(limits, 2, T0, tenant=1)
    refused = burst(limits, 1, T0, tenant=1)[0]
    assert isinstance(refused, Refusal) and refused.limit == "inflight" and refused.requests is None
    held[0].release()  # type: ignore[union-attr]
    held[0].release()  # type: ignore[union-attr]  # idempotent
    third = burst(limits, 1, T0, tenant=1)[0]
    assert isinstance(third, Lease)
    assert admitted(burst(limits, 1, T0, tenant=1)) == 0
    owner = LoadBoard(boards[0].spec, -1)
    owner.clear_worker(1, T0)  # worker 1 held one (the second of the burst) and died
    owner.close()
    assert admitted(burst(limits, 1, T0, tenant=1)) == 1
    assert admitted(burst(limits, 5, T0, tenant=0)) == 5  # the unlimited tenant beside it


def test_one_process_keeps_the_same_limits_on_its_own_board() -> None:
    limits = TenantLimits(LocalBoard(), [Limits(requests_per_minute=4, max_inflight=3)])
    results = [limits.admit(0, T0) for _ in range(6)]
    assert [type(r).__name__ for r in results] == ["Lease"] * 3 + ["Refusal"] * 3
    assert {r.limit for r in results[3:]} == {"inflight"}  # type: ignore[union-attr]
    for lease in results[:3]:
        lease.release()  # type: ignore[union-attr]
    assert isinstance(limits.admit(0, T0), Lease) and isinstance(limits.admit(0, T0), Refusal)  # the 4th, then the rate


def test_limiter_memory_stays_flat_however_many_requests_pass(boards: list[LoadBoard]) -> None:
    """A soak: the state is fixed cells per tenant, so 50,000 more requests leave nothing behind."""
    limits = workers(boards, Limits(requests_per_minute=600), Limits(tokens_per_minute=10_000, max_inflight=8), Limits(max_inflight=1))

    def run(requests: int, start: float) -> float:
        now = start
        for i in range(requests):
            now += 0.01
            worker = limits[i % 2]
            with worker._routing:
                lease = worker.admit(i % 3, now)
            if isinstance(lease, Lease):
                relayed = lease.metering(lambda t: None)
                for _ in range(4):
                    relayed(now)
                lease.settle(20, 4)
                lease.release()
            worker.fold(now)
        return now

    now = run(5_000, T0)  # warm: every code path taken, every list at its size
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        run(50_000, now)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    mine = [tracemalloc.Filter(True, "*gateway/pool/*")]
    growth = sum(stat.size_diff for stat in after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename"))
    assert growth < 4096, growth
