"""TurnPacer: a few requests start per turn of the event loop, the rest in order in the turns after."""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay.pacing import TurnPacer


class TurnCounter:
    """Counts the loop's turns: a callback that re-schedules itself runs once per turn."""

    def __init__(self) -> None:
        self.turn = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.turn += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def _request(pacer: TurnPacer, counter: TurnCounter, name: int, started: list[tuple[int, int]]) -> None:
    turn = pacer.turn()
    if turn is not None:
        await turn
    started.append((name, counter.turn))


def _streaming(per_turn: int) -> TurnPacer:
    pacer = TurnPacer(per_turn)
    pacer.streams = 1  # a stream in flight: bursts are paced
    return pacer


async def _burst(pacer: TurnPacer, requests: int) -> list[tuple[int, int]]:
    """`requests` arriving in one turn: (name, turn it started in) in the order they started."""
    counter = TurnCounter()
    started: list[tuple[int, int]] = []
    try:
        async with asyncio.timeout(5):
            await asyncio.gather(*(_request(pacer, counter, i, started) for i in range(requests)))
    finally:
        counter.stop()
    return started


async def test_a_burst_starts_a_few_per_turn_first_come_first_served() -> None:
    pacer = _streaming(3)
    started = await _burst(pacer, 20)
    assert [name for name, _ in started] == list(range(20))  # in arrival order
    per_turn: dict[int, int] = {}
    for _, turn in started:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) == 3 and len(per_turn) >= 7  # 20 requests need at least 7 turns of 3
    assert pacer.waiting == 0


async def test_with_no_stream_in_flight_a_burst_starts_at_once() -> None:
    started = await _burst(TurnPacer(3), 20)
    assert len({turn for _, turn in started}) == 1


async def test_requests_that_arrive_one_at_a_time_never_wait() -> None:
    pacer = _streaming(1)
    for _ in range(5):
        assert pacer.turn() is None
        await asyncio.sleep(0)  # the next request comes in a later turn
        await asyncio.sleep(0)


async def test_a_cancelled_waiter_gives_its_place_to_the_next() -> None:
    pacer, counter = _streaming(1), TurnCounter()
    started: list[tuple[int, int]] = []
    try:
        tasks = [asyncio.create_task(_request(pacer, counter, i, started)) for i in range(4)]
        await asyncio.sleep(0)  # every task asked for its turn; only the first started
        assert [name for name, _ in started] == [0] and pacer.waiting == 3
        tasks[1].cancel()
        async with asyncio.timeout(5):  # a place held by the cancelled request would leave the rest waiting
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        counter.stop()
    assert [name for name, _ in started] == [0, 2, 3]
    assert tasks[1].cancelled() and pacer.waiting == 0


def test_at_least_one_request_per_turn() -> None:
    with pytest.raises(ValueError):
        TurnPacer(0)
