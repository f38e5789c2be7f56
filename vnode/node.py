"""One target's node in virtual time: its servers on their GPUs, its router, and the records of what clients saw.

`submit` is one request sent by a client at `now`: the router places it (or refuses it), its server
checks it as the simulator does (SGLang's 400s for a prompt and output beyond the context or the KV
capacity), and every step that gives it tokens is one chunk to the router and the client. At its end
the client's `RequestRecord` is what the load tool would have recorded over HTTP, on the model's
clock: send time, one chunk per step (time and text), usage (prompt, completion and cached tokens),
the backend header where the target is specgate; the client hears of it in the next `ARRIVAL` phase.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from backends.sim.request import RequestError, SimRequest, check_context
from backends.sim.tokenizer import PseudoText
from loadtest.records import RequestRecord, RequestSpec
from vnode.events import ARRIVAL, EventQueue
from vnode.gpu import Server
from vnode.requests import Request
from vnode.router import Refused, Router

OnDone = Callable[[RequestRecord], None]


@dataclass(slots=True, eq=False)
class _Flight:
    request: Request
    sim: SimRequest
    server: int
    sent: float
    on_done: OnDone
    tier: str | None
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    produced: int = 0


class Node:
    """A target's servers and router on one virtual clock; see the module docstring.

    `backend_names[i]` is what the response header names for server i (None: no header, as a
    simulator called directly or through the balancer sends none).
    """

    def __init__(
        self,
        events: EventQueue,
        router: Router,
        text: PseudoText,
        context_length: int,
        backend_names: Sequence[str | None],
    ) -> None:
        self.events = events
        self.router = router
        self.text = text
        self.context_length = context_length
        self.backend_names = tuple(backend_names)
        self.servers: list[Server] = []
        self._flights: dict[str, _Flight] = {}
        self._rids = itertools.count()

    def add_server(self, server: Server) -> None:
        """The next server, in the order the router's indices count them."""
        self.servers.append(server)

    def submit(self, spec: RequestSpec, on_done: OnDone) -> None:
        """Send `spec` now; `on_done` gets its record once the response has ended."""
        now = self.events.now
        request = Request.of(f"vnode-{next(self._rids)}", spec)
        try:
            index = self.router.route(request, now)
        except Refused as refused:
            self._refuse(spec, now, refused.status, str(refused), on_done)
            return
        server = self.servers[index]
        try:
            check_context(request.prompt_tokens, request.max_tokens, self.context_length)
            server.core.check_fits(request.prompt_tokens, request.max_tokens)
        except RequestError as exc:
            self.router.finish(request, now, None)
            self._refuse(spec, now, 400, str(exc), on_done)
            return
        sim = SimRequest(
            rid=request.rid, prompt_ids=request.prompt_ids, max_new_tokens=request.max_tokens, is_streaming=True,
            text_start=self.text.start_for(request.prompt_key), created=0.0,
        )
        self._flights[request.rid] = _Flight(request, sim, index, now, on_done, spec.tier)
        server.submit(sim)

    def deliver(self, changed: list[SimRequest], now: float) -> None:
        """A step ended at `now`: each request it changed gets one chunk; ended ones are recorded."""
        flights, router = self._flights, self.router
        for sim in changed:
            flight = flights[sim.rid]
            gained = sim.produced - flight.produced
            flight.produced = sim.produced
            flight.times.append(now)
            flight.counts.append(gained)
            router.chunk(flight.request, now, gained)
            if sim.done:
                del flights[sim.rid]
                router.finish(flight.request, now, sim.produced)
                self.events.at(now, ARRIVAL, flight.on_done, self._record(flight, now))

    def _record(self, flight: _Flight, end: float) -> RequestRecord:
        sim = flight.sim
        texts = self.text.pieces(sim.text_start, flight.counts)
        return RequestRecord(
            start=flight.sent, expected_output=flight.request.max_tokens, headers_at=flight.times[0], end=end,
            status=200, chunk_times=flight.times, chunk_texts=texts, prompt_tokens=sim.prompt_tokens,
            completion_tokens=sim.produced, backend=self.backend_names[flight.server], cached_tokens=sim.cached_tokens,
            tier=flight.tier,
        )

    def _refuse(self, spec: RequestSpec, now: float, status: int, detail: str, on_done: OnDone) -> None:
        record = RequestRecord(start=now, expected_output=spec.output_len, status=status, error_kind=f"http_{status}",
                               error_detail=detail[:300], tier=spec.tier)
        self.events.at(now, ARRIVAL, on_done, record)
