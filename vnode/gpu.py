"""The simulated servers of a node and the GPUs they step on, in virtual time.

A `Gpu` is one group's timeline: its servers' engine cores (`backends.sim.core.EngineCore`, the
real-time simulator's own) take turns on it as the real-time `Engine`s do under the `Timeline`'s
first-come first-served lock. A server with work asks for the GPU; when a step ends its server
applies it, gives the GPU to the next server waiting (or takes it again, behind them), and only
then are its tokens delivered (a drafting server's joiners have their first token within the step:
see `backends.sim.core`). So a server plans its next step before any client reacts to the last one,
as the real-time loop does, and a request that arrives during a step joins the next one.
An idle server's first arrival starts a step at once: requests sent at one instant reach a real
server one after another, and the real-time loop starts stepping at the first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from backends.sim.core import EngineCore, StepPlan
from backends.sim.request import SimRequest
from vnode.events import STEP_END, EventQueue

Deliver = Callable[[list[SimRequest], float], None]  # the requests a step changed, and when it ended


class Gpu:
    """One group's GPU timeline: one step at a time, servers served in the order they asked."""

    __slots__ = ("busy", "events", "waiting")

    def __init__(self, events: EventQueue) -> None:
        self.events = events
        self.busy = False
        self.waiting: deque[Server] = deque()

    def want(self, server: Server) -> None:
        """`server` has work: it steps now, or once the servers ahead of it have."""
        if self.busy:
            self.waiting.append(server)
        else:
            self._step(server)

    def _step(self, server: Server) -> None:
        plan = server.core.plan_step()
        if plan is None:  # nothing it may run: the next server's turn
            server.active = False
            if self.waiting:
                self._step(self.waiting.popleft())
            return
        self.busy = True
        start = self.events.now
        if plan.early_first_token:
            self.events.at(start + plan.first_token_ms / 1000.0, STEP_END, self._first_tokens, server, plan)
        self.events.at(start + plan.duration_ms / 1000.0, STEP_END, self._end, server, plan, start)

    def _first_tokens(self, server: Server, plan: StepPlan) -> None:
        now = self.events.now
        server.deliver(server.core.first_tokens(plan, now), now)

    def _end(self, server: Server, plan: StepPlan, start: float) -> None:
        now = self.events.now
        changed = server.core.finish_step(plan, start, now)
        self.busy = False
        if server.core.has_work():
            self.waiting.append(server)
        else:
            server.active = False
        if self.waiting:
            self._step(self.waiting.popleft())
        server.deliver(changed, now)


class Server:
    """One simulated server: its name, its engine core, the GPU it steps on, where its tokens go."""

    __slots__ = ("active", "core", "deliver", "gpu", "name")

    def __init__(self, name: str, core: EngineCore, gpu: Gpu, deliver: Deliver) -> None:
        self.name = name
        self.core = core
        self.gpu = gpu
        self.deliver = deliver
        self.active = False  # waiting for its GPU or stepping

    def submit(self, req: SimRequest) -> None:
        """Queue `req`; an idle server asks for its GPU at once, so what arrives after it joins its next step."""
        self.core.enqueue(req)
        if not self.active:
            self.active = True
            self.gpu.want(self)
