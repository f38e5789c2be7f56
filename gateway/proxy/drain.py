"""The policy's look at the running streams a while after a response ends (`Policy.drain_mark`,
`Policy.drain_moves`): the adaptive policy's rule 9 moves a group's long answers to speculation once
requests stop coming. The look is a timer on the event loop, one per response end; a look that finds
nothing to move costs a counter read."""

from __future__ import annotations

import asyncio

from gateway.policies import DrainMark
from gateway.proxy.admission import Movable
from gateway.runtime import Runtime


def response_ended(rt: Runtime) -> None:
    """A response ended: set the policy's look, if it wants one and streams are still running."""
    if not rt.requests:
        return
    mark = rt.policy.drain_mark(rt.pool.clock())
    if mark is not None:
        asyncio.get_running_loop().call_later(mark.after, _look, rt, mark)


def _look(rt: Runtime, mark: DrainMark) -> None:
    """Move the streams the policy names, each after its next token event."""
    movable: dict[str, Movable] = {str(i): response for i, response in enumerate(rt.requests)}
    running = [r for key, response in movable.items() if (r := response.running(key)) is not None]
    if running:
        for key, target in rt.policy.drain_moves(rt.pool.snapshot(), mark, running):
            movable[key].move(target, "drain")
