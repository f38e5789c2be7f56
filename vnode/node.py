"""One target's node in virtual time: its servers on their GPUs, its router, and the records of what clients saw.

`submit` is one request sent by a client at `now`: `hop` later (the network and HTTP path between the
client and the servers, each way; 0 for an ideal node) the router places it (or refuses it), its
server checks it as the simulator does (SGLang's 400s for a prompt and output beyond the context or
the KV capacity) and queues it, and every step that gives it tokens is one chunk to the router at
the step's end and to the client `hop` after. At its end the client's `RequestRecord` is what the
load tool would have recorded over HTTP, on the model's clock: send time, one chunk per step (time
and text), usage (prompt, completion and cached tokens), the backend header where the target is
specgate; the client hears of it in the `ARRIVAL` phase of its last chunk's time.
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
from vnode.router import DrainLook, Refused, Router

OnDone = Callable[[RequestRecord], None]


@dataclass(slots=True, eq=False)
class _Flight:
    request: Request
    sim: SimRequest
    server: int
    sent: float
    on_done: OnDone
    tier: str | None
    start: int  # where its output starts in the model's text
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    produced: int = 0
    before: int = 0  # output tokens produced on servers it has moved from
    cached: int | None = None  # prompt tokens its first server found cached (None: not moved, its engine request's)
    move_to: int | None = None  # the server it moves to at its next chunk


class Node:
    """A target's servers and router on one virtual clock; see the module docstring.

    `backend_names[i]` is what the response header names for server i (None: no header, as a
    simulator called directly or through the balancer sends none); `hop` in seconds, each way.
    """

    def __init__(
        self,
        events: EventQueue,
        router: Router,
        text: PseudoText,
        context_length: int,
        backend_names: Sequence[str | None],
        hop: float = 0.0,
    ) -> None:
        self.events = events
        self.router = router
        self.text = text
        self.context_length = context_length
        self.backend_names = tuple(backend_names)
        self.hop = hop
        self.servers: list[Server] = []
        self._flights: dict[str, _Flight] = {}
        self._rids = itertools.count()
        self._engine_rids: dict[str, str] = {}  # a moved request's id -> its engine request's now

    def add_server(self, server: Server) -> None:
        """The next server, in the order the router's indices count them."""
        self.servers.append(server)

    def submit(self, spec: RequestSpec, on_done: OnDone) -> None:
        """Send `spec` now; `on_done` gets its record once the response has ended."""
        when = self.events.now + self.hop
        self.events.at(when, ARRIVAL, self._arrive, spec, on_done, self.events.now)

    def _arrive(self, spec: RequestSpec, on_done: OnDone, sent: float) -> None:
        now = self.events.now
        request = Request.of(f"vnode-{next(self._rids)}", spec)
        try:
            index = self.router.route(request, now)
        except Refused as refused:
            self._refuse(spec, sent, refused.status, str(refused), on_done)
            return
        server = self.servers[index]
        try:
            check_context(request.prompt_tokens, request.max_tokens, self.context_length)
            server.core.check_fits(request.prompt_tokens, request.max_tokens)
        except RequestError as exc:
            self.router.finish(request, now, None)
            self._refuse(spec, sent, 400, str(exc), on_done)
            return
        sim = SimRequest(
            rid=request.rid, prompt_ids=request.prompt_ids, max_new_tokens=request.max_tokens, is_streaming=True,
            text_start=self.text.start_for(request.prompt_key), created=0.0,
        )
        self._flights[request.rid] = _Flight(request, sim, index, sent, on_done, spec.tier, sim.text_start)
        server.submit(sim)
        for rid, to in self.router.take_moves():
            flight = self._flights[self._engine_rids.get(rid, rid)]
            if rid == request.rid:  # its handover: it leaves after its first token
                flight.move_to = to
            else:
                self._leave(flight, to, now)

    def _leave(self, flight: _Flight, to: int, now: float) -> None:
        """A move, as the exchange makes it: a request with no token yet is sent again whole now; one streaming
        leaves at its next chunk, as a relay stops between events."""
        if flight.times:
            flight.move_to = to
        else:
            self._resend(flight, to, now)

    def _resend(self, flight: _Flight, to: int, now: float) -> None:
        """What a gateway's move does to a request that has no token yet: it is aborted where it waits and
        sent whole to server `to` (its handover, if any, dropped). Left where it is if `to` cannot hold it."""
        request = flight.request
        server = self.servers[to]
        try:
            server.core.check_fits(request.prompt_tokens, request.max_tokens)
        except RequestError:
            return
        old = flight.sim
        self.servers[flight.server].core.abort(old, now)
        del self._flights[old.rid]
        sim = SimRequest(
            rid=f"{request.rid}~sent{next(self._rids)}", prompt_ids=request.prompt_ids, max_new_tokens=request.max_tokens, is_streaming=True,
            text_start=flight.start, created=0.0,
        )
        flight.sim, flight.server, flight.move_to = sim, to, None
        self._flights[sim.rid] = flight
        self._engine_rids[request.rid] = sim.rid
        self.router.resent(request, to, now)
        server.submit(sim)

    def _move(self, flight: _Flight, to: int, now: float) -> None:
        """What a gateway's move does to a request: it is aborted where it runs and sent to server `to` with
        its output so far appended to its prompt (SGLang's `continue_final_message`), for the rest of its
        limit; a greedy model goes on with the same text. Left where it is if `to` cannot hold it."""
        old = flight.sim
        produced = flight.before + old.produced
        ids = flight.request.prompt_ids + self.text.token_ids(flight.start, 0, produced)
        left = flight.request.max_tokens - produced
        server = self.servers[to]
        try:
            server.core.check_fits(len(ids), left)
        except RequestError:
            return
        self.servers[flight.server].core.abort(old, now)
        del self._flights[old.rid]
        sim = SimRequest(
            rid=f"{flight.request.rid}~{produced}", prompt_ids=ids, max_new_tokens=left, is_streaming=True,
            text_start=(flight.start + produced) % self.text.length, created=0.0,
        )
        flight.cached = old.cached_tokens if flight.cached is None else flight.cached
        flight.sim, flight.server, flight.before = sim, to, produced
        self._flights[sim.rid] = flight
        self._engine_rids[flight.request.rid] = sim.rid
        self.router.moved(flight.request, to, produced, now)
        server.submit(sim)

    def deliver(self, changed: list[SimRequest], now: float) -> None:
        """A step ended at `now`: each request it changed gets one chunk; ended ones are recorded."""
        flights, router = self._flights, self.router
        for sim in changed:
            flight = flights[sim.rid]
            gained = flight.before + sim.produced - flight.produced
            flight.produced = flight.before + sim.produced
            flight.times.append(now)
            flight.counts.append(gained)
            router.chunk(flight.request, now, gained)
            if sim.done:
                del flights[sim.rid]
                self._engine_rids.pop(flight.request.rid, None)
                router.finish(flight.request, now, flight.produced, self._cached(flight))
                look = router.drain_look(now)
                if look is not None:
                    self.events.at(look.at, ARRIVAL, self._drain, look, look=True)
                self.events.at(now + self.hop, ARRIVAL, flight.on_done, self._record(flight))
            elif flight.move_to is not None:
                to, flight.move_to = flight.move_to, None
                self._move(flight, to, now)

    def _drain(self, look: DrainLook) -> None:
        """The router's look after a response ended: the requests it moves leave (`_leave`)."""
        for rid, to in self.router.drain(look):
            flight = self._flights.get(self._engine_rids.get(rid, rid))
            if flight is not None:
                self._leave(flight, to, self.events.now)

    @staticmethod
    def _cached(flight: _Flight) -> int:
        return flight.sim.cached_tokens if flight.cached is None else flight.cached

    def _record(self, flight: _Flight) -> RequestRecord:
        hop = self.hop
        texts = self.text.pieces(flight.start, flight.counts)
        times = [t + hop for t in flight.times] if hop else flight.times  # when the client reads each chunk
        return RequestRecord(
            start=flight.sent, expected_output=flight.request.max_tokens, headers_at=times[0], end=times[-1],
            status=200, chunk_times=times, chunk_texts=texts, prompt_tokens=flight.request.prompt_tokens,
            completion_tokens=flight.produced, backend=self.backend_names[flight.server], cached_tokens=self._cached(flight),
            tier=flight.tier,
        )

    def _refuse(self, spec: RequestSpec, sent: float, status: int, detail: str, on_done: OnDone) -> None:
        record = RequestRecord(start=sent, expected_output=spec.output_len, status=status, error_kind=f"http_{status}",
                               error_detail=detail[:300], tier=spec.tier)
        self.events.at(self.events.now + self.hop, ARRIVAL, on_done, record)
