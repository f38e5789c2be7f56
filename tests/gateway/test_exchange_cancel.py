"""ExchangeCancel: a response's own cancellations of its request's task end there; anyone else's propagate."""

from __future__ import annotations

import asyncio

from gateway.proxy.cancel import ExchangeCancel


async def _exchange(own: ExchangeCancel, started: asyncio.Event) -> str:
    task = asyncio.current_task()
    assert task is not None
    own.running(task)
    try:
        started.set()
        await asyncio.sleep(30)
        return "finished"
    except asyncio.CancelledError:
        if not own.absorb(task):
            raise
        return "ended here"
    finally:
        own.running(None)


async def test_its_own_cancellation_ends_the_exchange_and_the_task_goes_on() -> None:
    own, started = ExchangeCancel(), asyncio.Event()
    task = asyncio.create_task(_exchange(own, started))
    await started.wait()
    assert own.cancel()
    assert await asyncio.wait_for(task, 5) == "ended here"
    assert task.cancelling() == 0  # undone: later timeouts in the task work as usual


async def test_anyone_elses_cancellation_propagates_even_with_its_own() -> None:
    own, started = ExchangeCancel(), asyncio.Event()
    task = asyncio.create_task(_exchange(own, started))
    await started.wait()
    own.cancel()
    task.cancel()  # the server cancels the request too
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()
    own, started = ExchangeCancel(), asyncio.Event()
    task = asyncio.create_task(_exchange(own, started))
    await started.wait()
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()


async def test_nothing_is_cancelled_once_the_exchange_stopped() -> None:
    own, started = ExchangeCancel(), asyncio.Event()
    assert not own.cancel()  # not started
    own.running(None)
    assert not own.cancel()
    task = asyncio.create_task(_exchange(own, started))
    await started.wait()
    own.running(None)  # as if the exchange ended
    assert not own.cancel()
    task.cancel()
    await asyncio.wait({task}, timeout=5)
