"""Load shapes: closed loop (C at a time, back to back) and open loop (each at its arrival time).

`run_plan` executes a level's plan (`loadtest.workloads.plan.Plan`): its sessions C at a time or
each at its start, a session's turns one after another, each sent `think_s` after the previous
answer, carrying the answers the server returned. `closed_loop` and `open_loop` send lists of
ready-made requests the same two ways.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from loadtest.records import LevelRun, RequestRecord, RequestSpec
from loadtest.workloads.plan import Plan, Session

Sender = Callable[[RequestSpec], Awaitable[RequestRecord]]
OnDone = Callable[[RequestRecord], None]
Job = Callable[[], Coroutine[Any, Any, None]]
SKIPPED = "skipped"  # the error kind of a turn not sent because an earlier turn of its session failed


def _ignore(_: RequestRecord) -> None:
    return None


async def _closed(jobs: Sequence[Job], concurrency: int) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    pending = iter(jobs)

    async def worker() -> None:
        # Workers share one iterator, so whichever finishes first takes the next job.
        for job in pending:
            await job()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))


async def _open(jobs: Sequence[Job], offsets: Sequence[float], started: float) -> None:
    if len(offsets) != len(jobs):
        raise ValueError("need one arrival time per request")
    tasks: list[asyncio.Task[None]] = []
    for job, offset in sorted(zip(jobs, offsets), key=lambda jo: jo[1]):
        # Absolute deadlines: a late wake-up does not push every later arrival back.
        delay = started + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(job()))
    await asyncio.gather(*tasks)


class _Recorder:
    """Sends requests and keeps their records, telling `on_done` of each."""

    def __init__(self, send: Sender, on_done: OnDone) -> None:
        self.send = send
        self.on_done = on_done
        self.records: list[RequestRecord] = []

    def keep(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.on_done(record)

    def one(self, spec: RequestSpec) -> Job:
        async def job() -> None:
            self.keep(await self.send(spec))

        return job

    def session(self, session: Session, time_scale: float) -> Job:
        async def job() -> None:
            answers: list[str] = []
            for k, turn in enumerate(session.turns):
                if k and turn.think_s:
                    await asyncio.sleep(turn.think_s * time_scale)
                record = await self.send(session.request(k, answers))
                self.keep(record)
                if not record.ok:  # the user saw an error: the conversation ends here
                    for rest in session.turns[k + 1:]:
                        self.keep(RequestRecord(
                            start=time.perf_counter(), expected_output=rest.output_len, tier=session.tier,
                            error_kind=SKIPPED, error_detail="an earlier turn of its conversation failed",
                        ))
                    return
                answers.append(record.answer)

        return job


async def run_plan(send: Sender, plan: Plan, on_done: OnDone = _ignore, time_scale: float = 1.0) -> LevelRun:
    """Execute `plan`; its times (session starts, think times) are multiplied by `time_scale`."""
    recorder = _Recorder(send, on_done)
    jobs = [recorder.session(s, time_scale) for s in plan.sessions]
    started = time.perf_counter()
    if plan.concurrency is not None:
        await _closed(jobs, plan.concurrency)
    else:
        await _open(jobs, [s.start_s * time_scale for s in plan.sessions], started)
    return LevelRun(started=started, finished=time.perf_counter(), records=recorder.records)


async def closed_loop(
    send: Sender, specs: Sequence[RequestSpec], concurrency: int, on_done: OnDone = _ignore
) -> LevelRun:
    """Run `specs` with `concurrency` workers; each sends its next request as soon as its last ended."""
    recorder = _Recorder(send, on_done)
    started = time.perf_counter()
    await _closed([recorder.one(spec) for spec in specs], concurrency)
    return LevelRun(started=started, finished=time.perf_counter(), records=recorder.records)


async def open_loop(
    send: Sender, specs: Sequence[RequestSpec], arrivals: Sequence[float], on_done: OnDone = _ignore
) -> LevelRun:
    """Send each request at its arrival offset (seconds from now), whether or not others finished."""
    recorder = _Recorder(send, on_done)
    started = time.perf_counter()
    await _open([recorder.one(spec) for spec in specs], arrivals, started)
    return LevelRun(started=started, finished=time.perf_counter(), records=recorder.records)
