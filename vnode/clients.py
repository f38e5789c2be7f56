"""The load tool's clients in virtual time: a level's plan run as `loadtest.load.run_plan` runs it over HTTP.

Closed loop: `plan.concurrency` workers take sessions from one queue, each starting its next as
soon as its last ended. Open loop: each session starts at its `start_s` after the level's start.
A session's turns go one after another, each `think_s` after the previous answer came back and
carrying the answers the server actually returned; a failed turn ends its conversation and its
later turns are recorded as skipped. Times are the model's (no time scale).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from loadtest.load import SKIPPED
from loadtest.records import LevelRun, RequestRecord, RequestSpec
from loadtest.workloads.plan import Plan, Session
from vnode.events import ARRIVAL
from vnode.node import Node


class _PlanRun:
    """One plan on one node: its sessions' progress and the records kept."""

    def __init__(self, node: Node, plan: Plan) -> None:
        self.node = node
        self.plan = plan
        self.records: list[RequestRecord] = []
        self._queue: Iterator[Session] = iter(plan.sessions)

    def start(self) -> None:
        events = self.node.events
        if self.plan.concurrency is not None:
            if self.plan.concurrency < 1:
                raise ValueError(f"concurrency must be at least 1, got {self.plan.concurrency}")
            for _ in range(min(self.plan.concurrency, len(self.plan.sessions))):
                events.at(events.now, ARRIVAL, self._next_session)
        else:
            for session in sorted(self.plan.sessions, key=lambda s: s.start_s):
                events.at(events.now + session.start_s, ARRIVAL, self._turn, session, 0, [])

    def _next_session(self) -> None:
        session = next(self._queue, None)
        if session is not None:
            self._turn(session, 0, [])

    def _turn(self, session: Session, k: int, answers: list[str]) -> None:
        spec = _opening(session) if k == 0 else session.request(k, answers)
        self.node.submit(spec, lambda record: self._answered(session, k, answers, record))

    def _answered(self, session: Session, k: int, answers: list[str], record: RequestRecord) -> None:
        self.records.append(record)
        events = self.node.events
        if not record.ok:  # the user saw an error: the conversation ends here
            for rest in session.turns[k + 1:]:
                self.records.append(RequestRecord(
                    start=events.now, expected_output=rest.output_len, tier=session.tier,
                    error_kind=SKIPPED, error_detail="an earlier turn of its conversation failed",
                ))
        elif k + 1 < len(session.turns):
            answers.append(record.answer)
            events.at(events.now + session.turns[k + 1].think_s, ARRIVAL, self._turn, session, k + 1, answers)
            return
        if self.plan.concurrency is not None:
            self._next_session()


@lru_cache(maxsize=8192)  # every target of an envelope runs the same plans: make each opening request once
def _opening(session: Session) -> RequestSpec:
    """A session's first request (it depends on no answer)."""
    return session.request(0, [])


def run_plan(node: Node, plan: Plan) -> LevelRun:
    """Execute `plan` on `node` from its clock's current time until every session is done."""
    events = node.events
    started = events.now
    run = _PlanRun(node, plan)
    run.start()
    events.run()
    return LevelRun(started=started, finished=events.now, records=run.records)
