"""In-flight accounting: exact, never negative, released once, moved once; the load integral and decode window."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.pool.backends import PROGRESS_CHUNKS, Backend, DecodeWindow, Health, Pool, Slot
from gateway.pool.board import AREA, INFLIGHT, SINCE, LoadBoard


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
    clock = [100.0]
    pool = Pool([Backend("eagle", "http://e", True)], clock=lambda: clock[0])
    backend = pool["eagle"]
    assert backend.load_area(110.0) == 0.0
    held = [pool.acquire("eagle") for _ in range(3)]  # three in flight from t=100
    assert backend.load_area(110.0) == 30.0
    clock[0] = 110.0
    held.pop().release()
    assert backend.load_area(120.0) == 30.0 + 20.0


async def test_wait_idle() -> None:
    pool = make_pool()
    slot = pool.acquire("eagle")
    assert not await pool.wait_idle(0.01)
    asyncio.get_running_loop().call_soon(slot.release)
    assert await pool.wait_idle(5)


async def test_wait_gateway_idle_waits_for_the_other_workers_requests() -> None:
    owner = LoadBoard.create(2, 2)
    views = [LoadBoard(owner.spec, w) for w in range(2)]
    try:
        idle, busy = (Pool([Backend("eagle", "http://e", True), Backend("plain", "http://p", False)], board=v) for v in views)
        slot = busy.acquire("plain")
        assert idle.own_inflight == 0 and idle.total_inflight == 1
        # This worker's own requests are done; the other worker's are not.
        assert await idle.wait_idle(0.01)
        assert not await idle.wait_gateway_idle(0.2)
        asyncio.get_running_loop().call_soon(slot.release)
        assert await idle.wait_gateway_idle(5)
        # And its own requests are waited for as before.
        own = idle.acquire("eagle")
        assert not await idle.wait_gateway_idle(0.05)
        asyncio.get_running_loop().call_soon(own.release)
        assert await idle.wait_gateway_idle(5)
    finally:
        for view in views:
            view.close()
        owner.close(unlink=True)


def test_move_to_keeps_counts_exact_and_release_still_once() -> None:
    pool = make_pool()
    slot = pool.acquire("eagle")
    slot.move_to("plain")
    assert (pool["eagle"].inflight, pool["plain"].inflight) == (0, 1)
    assert slot.backend is pool["plain"]
    slot.release()
    slot.release()
    assert pool.total_inflight == 0 and pool["eagle"].inflight == 0
    with pytest.raises(RuntimeError):
        slot.move_to("eagle")
    assert pool.total_inflight == 0


def test_a_slot_cannot_move_once_tokens_arrived() -> None:
    pool = make_pool()
    slot = pool.acquire("eagle")
    slot.mark_token(time.monotonic())
    with pytest.raises(RuntimeError):
        slot.move_to("plain")
    assert (pool["eagle"].inflight, pool["plain"].inflight) == (1, 0)


def test_a_started_slot_continued_elsewhere_moves_its_counts_and_starts_a_new_window() -> None:
    pool = make_pool()
    slot = pool.acquire("eagle", max_tokens=100)
    for k in range(3):
        slot.mark_token(10.0 + k)
    assert pool["eagle"].relayed_chunks == 3
    slot.continue_on("plain", max_tokens=60)
    assert (pool["eagle"].inflight, pool["plain"].inflight) == (0, 1)
    assert pool["eagle"].relayed_chunks == 0 and slot.decode_window() is None  # its old chunks left with it
    slot.mark_token(20.0)
    slot.mark_token(21.0)
    window = slot.decode_window()
    assert window is not None and window.seconds == pytest.approx(1.0) and pool["plain"].relayed_chunks == 2
    slot.release()
    slot.release()
    assert pool.total_inflight == 0 and pool["plain"].relayed_chunks == 0
    with pytest.raises(RuntimeError):
        slot.continue_on("eagle", None)


def set_load(backend: Backend, since: float, inflight: int) -> None:
    """Make the backend's load integral exactly computable: `inflight` held from `since` on."""
    backend._load_area, backend._load_since, backend.inflight = 0.0, since, inflight
    for field, value in ((AREA, 0.0), (SINCE, since), (INFLIGHT, inflight)):
        backend.board.write(backend.index, field, value)


def test_decode_window_is_the_mean_load_between_first_and_last_token() -> None:
    eagle = Backend("eagle", "http://e", True, group="g0")
    plain = Backend("plain", "http://p", False, group="g0")
    alone = Backend("other", "http://o", False)
    pool = Pool([eagle, plain, alone])
    slot = Slot(pool, eagle)
    set_load(eagle, 0.0, 2)
    set_load(plain, 0.0, 3)
    set_load(alone, 0.0, 7)  # another group: never part of this request's shared load
    assert slot.decode_window() is None
    slot.mark_token(10.0)
    assert slot.decode_window() is None  # one token: no window yet
    slot.mark_token(12.0)
    slot.mark_token(14.0)
    window = slot.decode_window()
    assert window == DecodeWindow(seconds=4.0, mean_inflight=2.0, mean_group_inflight=5.0)


def test_decode_window_follows_load_changes_between_the_tokens() -> None:
    clock = [0.0]
    pool = Pool([Backend("eagle", "http://e", True)], clock=lambda: clock[0])
    slot = pool.acquire("eagle")
    pool.acquire("eagle")  # two in flight from t=0
    slot.mark_token(10.0)
    clock[0] = 12.0
    late = [pool.acquire("eagle"), pool.acquire("eagle")]  # four from t=12
    slot.mark_token(13.0)
    slot.mark_token(14.0)
    clock[0] = 14.0
    for extra in late:
        extra.release()  # back to two the moment the stream ends, before its window is read
    window = slot.decode_window()
    assert window == DecodeWindow(seconds=4.0, mean_inflight=3.0, mean_group_inflight=3.0)  # (2*2 + 4*2) / 4


def test_a_decode_window_counts_the_prompt_tokens_sent_to_its_group_while_it_decoded() -> None:
    clock = [0.0]
    pool = Pool([
        Backend("eagle", "http://e", True, group="g0"), Backend("plain", "http://p", False, group="g0"), Backend("other", "http://o", False),
    ], clock=lambda: clock[0])
    slot = pool.acquire("eagle", prompt_tokens=500.0)  # its own prefill comes before its first token
    heard: list[DecodeWindow] = []
    slot.on_progress = lambda name, window: heard.append(window)
    slot.mark_token(1.0)
    pool.acquire("plain", prompt_tokens=300.0)  # the other server of its group: their prefill stalls this stream
    pool.acquire("eagle", prompt_tokens=40.0)
    pool.acquire("other", prompt_tokens=900.0)  # another group's GPUs
    for chunk in range(1, PROGRESS_CHUNKS + 2):
        if chunk == PROGRESS_CHUNKS + 1:
            pool.acquire("eagle", weight=2, prompt_tokens=10.0)  # a batched request: 2 sequences of 10
        slot.mark_token(1.0 + chunk)
    assert [w.group_prompt_tokens for w in heard] == [340.0]
    window = slot.decode_window()
    assert window is not None and window.group_prompt_tokens == 360.0
    assert pool["eagle"].sent_prompt_tokens_total == 560.0 and pool["other"].sent_prompt_tokens_total == 900.0
    assert pool.snapshot().get("plain").sent_prompt_tokens == 300.0


def test_a_streams_prompt_counts_in_other_windows_once_its_prefill_is_done() -> None:
    """A stream's prompt is prefilled when its first token comes, which an engine short of room delays
    past the windows of the streams it was sent beside; an unstreamed request's counts when routed."""
    clock = [0.0]
    pool = Pool([Backend("eagle", "http://e", True, group="g0"), Backend("plain", "http://p", False, group="g0")], clock=lambda: clock[0])
    slot = pool.acquire("eagle", prompt_tokens=500.0, streamed=True)
    assert pool["eagle"].sent_prompt_tokens_total == 0.0  # routed, not yet prefilled
    slot.mark_token(1.0)
    assert pool["eagle"].sent_prompt_tokens_total == 500.0  # its first token: its own window starts after it
    prefilled = pool.acquire("plain", prompt_tokens=300.0, streamed=True)
    pool.acquire("eagle", prompt_tokens=40.0)  # not streamed: no first token is seen, so it counts now
    queued = pool.acquire("eagle", prompt_tokens=70.0, streamed=True)  # its first token comes after the window
    slot.mark_token(2.0)
    prefilled.mark_token(2.5)
    slot.mark_token(3.0)
    window = slot.decode_window()
    assert window is not None and window.group_prompt_tokens == 340.0
    queued.mark_token(4.0)
    queued.continue_on("plain", None)  # moved: the new server prefills it again at its first token there
    assert pool["plain"].sent_prompt_tokens_total == 300.0
    queued.mark_token(5.0)
    assert pool["plain"].sent_prompt_tokens_total == 370.0 and pool["eagle"].sent_prompt_tokens_total == 610.0


def test_a_stream_reports_its_progress_every_few_chunks() -> None:
    clock = [0.0]
    eagle = Backend("eagle", "http://e", True, group="g0")
    plain = Backend("plain", "http://p", False, group="g0")
    pool = Pool([eagle, plain], clock=lambda: clock[0])
    slot = pool.acquire("eagle")
    pool.acquire("plain")  # the group's other server holds one throughout
    heard: list[tuple[str, DecodeWindow]] = []
    slot.on_progress = lambda name, window: heard.append((name, window))
    for chunk in range(2 * PROGRESS_CHUNKS + 3):
        clock[0] = 1.0 + 0.5 * chunk
        if chunk == PROGRESS_CHUNKS:
            pool.acquire("eagle")  # a second EAGLE request from the first stretch's end on
        slot.mark_token(clock[0])
    stretch = 0.5 * PROGRESS_CHUNKS
    assert heard == [
        ("eagle", DecodeWindow(stretch, 1.0, 2.0, PROGRESS_CHUNKS)),
        ("eagle", DecodeWindow(stretch, 2.0, 3.0, PROGRESS_CHUNKS)),
    ]
    # The whole response's window is unchanged by the stretches.
    window = slot.decode_window()
    assert window is not None and window.seconds == 0.5 * (2 * PROGRESS_CHUNKS + 2)


def test_a_stream_nobody_listens_to_reports_nothing() -> None:
    pool = Pool([Backend("plain", "http://p", False)])
    slot = pool.acquire("plain")
    for chunk in range(3 * PROGRESS_CHUNKS):
        slot.mark_token(float(chunk))
    assert slot.on_progress is None and slot.decode_window() is not None


def test_a_backend_without_a_group_is_its_own_group() -> None:
    pool = make_pool()
    pool.acquire("eagle")
    snap = pool.snapshot()
    assert snap.get("eagle").group == "eagle" and snap.group_inflight(snap.get("eagle")) == 1
    assert snap.group_inflight(snap.get("plain")) == 0
