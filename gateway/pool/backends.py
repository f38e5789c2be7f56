"""The backends, their health, exact in-flight counts, and the slot a routed request holds.

The in-flight count is the routing signal, so it must be exact: a `Slot` is taken when a request is
routed and released exactly once when its response ends, on every path (finished, error, timeout,
client gone), tied to the response's lifetime by `try/finally` in the code that owns the response
body, as SMG's guard objects are. Backends of one group share GPUs; a backend named in no group is
a group of its own. The pool keeps each backend's load integral (so a slot can tell the mean load
its request decoded under) and the prompt tokens its requests were sent to prefill, a stream's counted
once its first token came (so a slot can tell the prefill that ran between its steps), and, over its in-flight requests, the output they
are expected to produce and the token-bearing chunks relayed so far. Every number goes through the pool's `Board`
(`board.py`): the process's own, or the whole gateway's with several workers. Time is the pool's
`clock` (`time.monotonic` in the gateway; a virtual-time model of the node passes its own).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable

import orjson
from dataclasses import dataclass, field

from gateway.pool.board import AREA, CACHED, CHUNKS, EXPECTED, HELD, INFLIGHT, PREDICTED, PROMPT, SENT, SERVED, SINCE, Board, LocalBoard
from gateway.pool.engine_load import EngineLoad, engine_load_json, parse_engine_load
from gateway.pool.snapshot import BackendView, PoolSnapshot
from gateway.pool.tenant_limits import Lease

OUTPUT_EWMA = 0.1  # weight of each finished response in a backend's mean output length
# A streaming response tells its slot's listener of its pace every this many token-bearing chunks: a
# few steps, so the load barely moves within one, and a 64-token response reports more than once.
PROGRESS_CHUNKS = 8
_BOARD_POLL = 0.05  # seconds between reads of the other workers' in-flight counts while draining

Clock = Callable[[], float]  # seconds, monotonic
log = logging.getLogger("specgate.pool")


class Health(enum.Enum):
    """What the gateway believes about a backend; only READY receives traffic."""

    STARTING = "starting"  # never seen ready yet
    READY = "ready"
    UNREADY = "unready"  # answers 503: warming up, draining or unhealthy
    DOWN = "down"  # connection refused or reset
    FAILING = "failing"  # timed out on real traffic; only a passing /health brings it back


_STATES = list(Health)  # a health state's code on the board is its index here


@dataclass(frozen=True)
class DecodeWindow:
    """One response's decode window (first to last token) and the mean load it ran under."""

    seconds: float
    mean_inflight: float  # its backend's mean in-flight count over the window
    mean_group_inflight: float  # the same for all backends of that backend's group
    chunks: int = 0  # token-bearing chunks that arrived after the window opened (its steps)
    # Prompt tokens its group's requests were sent to prefill within the window (a stream's at its first
    # token, another's when routed): an engine runs a prefill between decode steps, so their prefill time
    # is inside this window's seconds.
    group_prompt_tokens: float = 0.0


@dataclass
class Backend:
    """Mutable state of one backend; owned by the pool, changed only through it and the health checker."""

    name: str
    url: str
    speculative: bool
    served_model_name: str | None = None
    group: str = ""  # empty: a group of its own (named after the backend)
    model_card: dict[str, object] | None = None
    health: Health = Health.STARTING
    health_detail: str = ""
    inflight: int = 0
    served: int = 0
    # Sums over the in-flight requests (see BackendView), kept in O(1) by their slots.
    expected_tokens: float = 0.0
    relayed_chunks: int = 0
    held_prompt_tokens: float = 0.0
    # Those of every request it was sent to prefill, ever: a stream's once its first token came from it (its
    # prefill done: a continued stream's prompt again), another's when routed.
    sent_prompt_tokens: float = 0.0
    mean_output_tokens: float | None = None  # EWMA of completed responses' lengths
    # Prompt tokens of its finished responses: sent, reported cached, predicted cached by the prefix map.
    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted_tokens: float = 0.0
    engine_load: EngineLoad | None = None  # its own /v1/loads at the last poll; None while not ready
    # Integral of `inflight` over time, so a request can learn the mean load it ran under in O(1).
    _load_area: float = 0.0
    _load_since: float = 0.0
    clock: Clock = time.monotonic  # the pool's, once it holds this backend
    # Where this process's numbers go and the gateway's are read (the fields above are this
    # process's share; the `*_total` properties and the view are the gateway's).
    board: Board = field(default_factory=LocalBoard)
    index: int = 0  # this backend's column on the board

    def __post_init__(self) -> None:
        self.group = self.group or self.name
        self._load_since = self.clock()

    @property
    def inflight_total(self) -> int:
        """Requests in flight on this backend across the whole gateway (every worker)."""
        return int(self.board.total(self.index, INFLIGHT))

    @property
    def served_total(self) -> int:
        return int(self.board.total(self.index, SERVED))

    @property
    def held_prompt_tokens_total(self) -> float:
        """Prompt tokens its in-flight requests were sent to prefill, across the whole gateway."""
        return self.board.total(self.index, HELD)

    @property
    def expected_tokens_total(self) -> float:
        """Output tokens its in-flight requests are expected to produce, across the whole gateway."""
        return self.board.total(self.index, EXPECTED)

    @property
    def sent_prompt_tokens_total(self) -> float:
        """Prompt tokens every request routed to it was sent to prefill, across the whole gateway: a stream's
        once its first token came from it, another's when routed."""
        return self.board.total(self.index, SENT)

    def _sent(self, prompt: float) -> None:
        self.sent_prompt_tokens += prompt
        self.board.write(self.index, SENT, self.sent_prompt_tokens)

    def _add(self, expected: float = 0.0, chunks: int = 0, prompt: float = 0.0) -> None:
        self.expected_tokens += expected
        self.relayed_chunks += chunks
        self.held_prompt_tokens += prompt
        self.board.write(self.index, EXPECTED, self.expected_tokens)
        self.board.write(self.index, CHUNKS, self.relayed_chunks)
        self.board.write(self.index, HELD, self.held_prompt_tokens)

    def _view(self) -> BackendView:
        board, i = self.board, self.index
        inflight, expected, chunks = self.inflight_total, self.expected_tokens_total, int(board.total(i, CHUNKS))
        held, sent = self.held_prompt_tokens_total, self.sent_prompt_tokens_total
        load = self.engine_load
        if load is None:
            return BackendView(
                self.name, self.speculative, self.available, inflight, self.group, expected, chunks, held_prompt_tokens=held, sent_prompt_tokens=sent
            )
        return BackendView(
            self.name, self.speculative, self.available, inflight, self.group, expected, chunks,
            load.kv_tokens, load.kv_rank_tokens, load.prefill_tokens, load.prefill_busy_us, load.decode_moments, held, sent,
        )

    @property
    def available(self) -> bool:
        return self.health is Health.READY

    def load_area(self, now: float) -> float:
        """Integral of the gateway's in-flight count on this backend up to `now` (request-seconds)."""
        return self.board.load_area(self.index, now)

    def _change(self, delta: int) -> None:
        now = self.clock()
        self._load_area += self.inflight * (now - self._load_since)
        self._load_since = now
        self.inflight += delta
        board = self.board
        # Area and time base before the count: a reader between the stores sees a consistent
        # integral up to the old count's last instant, off by at most one request for nanoseconds.
        board.write(self.index, AREA, self._load_area)
        board.write(self.index, SINCE, now)
        board.write(self.index, INFLIGHT, self.inflight)


class Slot:
    """One routed request's hold on a backend, and the load its response decoded under.

    `release()` is idempotent; `move_to` re-homes the hold before any byte was exchanged (failover),
    `continue_on` after (a stream continued on another backend);
    `mark_token` stamps each chunk carrying generated tokens, so `decode_window` can tell the
    request's mean load, and counts it towards its backend's relayed chunks. A slot of `weight` w
    (a batched native request: w sequences upstream) counts w in flight and w times the expected output.
    It counts the prompt tokens it was routed to prefill (`prompt_tokens` a sequence) on whichever backend
    it holds, so a backend's view tells the KV room its in-flight requests take.
    """

    __slots__ = (
        "backend", "weight", "lease", "_pool", "_released", "acquired_at", "_first", "_last_at", "_max_tokens", "_expected",
        "_prompt", "_chunks", "_mark", "on_progress", "_streamed",
    )

    def __init__(
        self, pool: Pool, backend: Backend, max_tokens: int | None = None, weight: int = 1, prompt_tokens: float = 0.0, streamed: bool = False
    ) -> None:
        self._pool = pool
        self._streamed = streamed
        self.backend = backend
        self.weight = weight
        self.lease: Lease | None = None  # its tenant's hold on its limits, given back with the slot
        self._released = False
        self._max_tokens = max_tokens
        self._prompt = prompt_tokens * weight
        self._chunks = 0
        self._expected = self._expect(backend)
        self.acquired_at = pool.clock()
        # (time, backend load area, group load area, group prompt tokens sent) at the first token; the
        # latest token's time.
        self._first: tuple[float, float, float, float] | None = None
        self._last_at = 0.0
        # Told of every PROGRESS_CHUNKS chunks while the response streams (None: nobody listens); the
        # current stretch's start: (time, backend load area, group load area, group prompt tokens sent, chunks
        # relayed by then).
        self.on_progress: Callable[[str, DecodeWindow], None] | None = None
        self._mark: tuple[float, float, float, float, int] = (0.0, 0.0, 0.0, 0.0, 0)

    @property
    def released(self) -> bool:
        return self._released

    @property
    def chunks(self) -> int:
        """Chunks carrying tokens its response relayed from its backend (since `continue_on`, if it moved)."""
        return self._chunks

    @property
    def max_tokens(self) -> int | None:
        """The output limit it holds its backend for (None: none given)."""
        return self._max_tokens

    def release(self) -> None:
        """Give the slot back; later calls do nothing."""
        if self._released:
            return
        self._released = True
        self._pool._release(self.backend, self.weight)
        self.backend._add(-self._expected, -self._chunks, -self._prompt)
        if self.lease is not None:
            self.lease.release()

    def _expect(self, backend: Backend) -> float:
        """Count this request on `backend`: its expected output (its max_tokens, else the backend's mean
        length), returned, and its prompt tokens."""
        per_sequence = float(self._max_tokens if self._max_tokens is not None else backend.mean_output_tokens or 0.0)
        expected = per_sequence * self.weight
        backend._add(expected, prompt=self._prompt)
        if not self._streamed:
            backend._sent(self._prompt)
        return expected

    def move_to(self, name: str) -> None:
        """Hold backend `name` instead: the old one's count drops by the slot's weight, the new one's rises by it."""
        if self._released:
            raise RuntimeError("a released slot cannot move")
        if self._first is not None:
            raise RuntimeError("a slot cannot move once its response has started")
        self._pool._release(self.backend, self.weight)
        self.backend._add(-self._expected, prompt=-self._prompt)
        self.backend = self._pool._take(name, self.weight)
        self._expected = self._expect(self.backend)

    def continue_on(self, name: str, max_tokens: int | None) -> None:
        """Hold backend `name` for the rest of a response that has started (a stream continued there, its
        output so far given back): the counts move as `move_to`'s do, the chunks it relayed leave the
        old backend's count, the decode window starts again, the lease stays."""
        if self._released:
            raise RuntimeError("a released slot cannot move")
        self._pool._release(self.backend, self.weight)
        self.backend._add(-self._expected, -self._chunks, -self._prompt)
        self.backend = self._pool._take(name, self.weight)
        self._max_tokens = max_tokens
        self._expected = self._expect(self.backend)
        self._chunks = 0
        self._first = None
        self._last_at = 0.0
        self._mark = (0.0, 0.0, 0.0, 0.0, 0)

    def mark_token(self, now: float) -> None:
        """A chunk carrying generated tokens arrived at `now` (on the pool's clock)."""
        if self._first is None:
            if self._streamed:
                # Its prefill ended here, before its own window: an engine queues a prefill it has no room
                # for, so one counted when sent would fall in other streams' windows it did not stall.
                self.backend._sent(self._prompt)
            self._first = (now, *self._areas(now))
            self._mark = (*self._first, self._chunks + 1)
        elif self.on_progress is not None and self._chunks + 1 - self._mark[4] >= PROGRESS_CHUNKS:
            self._progress(now, self._chunks + 1)
        self._last_at = now
        self._chunks += 1
        backend = self.backend  # the backend's count inline, one board cell: a call less per chunk
        backend.relayed_chunks += 1
        backend.board.write(backend.index, CHUNKS, backend.relayed_chunks)

    def _progress(self, now: float, chunks: int) -> None:
        """Close the stretch at the chunk that arrived at `now` (the slot's `chunks`-th) and open the next."""
        t0, area0, group0, sent0, chunks0 = self._mark
        area1, group1, sent1 = self._areas(now)
        self._mark = (now, area1, group1, sent1, chunks)
        seconds = now - t0
        if seconds > 0.0 and self.on_progress is not None:
            window = DecodeWindow(seconds, (area1 - area0) / seconds, (group1 - group0) / seconds, chunks - chunks0, sent1 - sent0)
            self.on_progress(self.backend.name, window)

    def _areas(self, at: float) -> tuple[float, float, float]:
        """Its backend's and its group's load integrals up to `at`, and the prompt tokens sent to its group."""
        backend, pool = self.backend, self._pool
        area = backend.load_area(at)
        if not pool.shares_group(backend):
            return area, area, backend.sent_prompt_tokens_total
        return area, pool.group_load_area(backend.group, at), pool.group_sent_prompt_tokens(backend.group)

    def decode_window(self) -> DecodeWindow | None:
        """First to last token and the mean loads over it; None before two tokens at distinct times.

        Called at the response's end; the integrals at the last token are read then, not at every token:
        exact unless the in-flight count changed since the last token (one read earlier), where a change
        of k requests moves the integral by k times that gap."""
        if self._first is None:
            return None
        t0, area0, group0, sent0 = self._first
        t1 = self._last_at
        seconds = t1 - t0
        if seconds <= 0.0:
            return None
        area1, group1, sent1 = self._areas(t1)
        return DecodeWindow(seconds, (area1 - area0) / seconds, (group1 - group0) / seconds, group_prompt_tokens=sent1 - sent0)


class Pool:
    """All backends, their health and in-flight counts; `board` holds what the gateway's workers share;
    `clock` times the load integrals and slots."""

    def __init__(self, backends: list[Backend], board: Board | None = None, clock: Clock = time.monotonic) -> None:
        self.board: Board = board or LocalBoard()
        self.clock = clock
        self._backends = {b.name: b for b in backends}
        for index, backend in enumerate(backends):
            backend.board, backend.index, backend.clock = self.board, index, clock
            backend._load_since = clock()  # nothing integrated yet: the integral starts on the pool's clock
        self._idle = asyncio.Event()
        self._idle.set()
        self._health_version = self._cards_version = self._loads_version = 0
        self._unshared: set[str] = set()  # blobs the board could not take at their last publication
        self._group_sizes: dict[str, int] = {}
        for b in backends:
            self._group_sizes[b.group] = self._group_sizes.get(b.group, 0) + 1

    def publish_health(self, backend: Backend) -> None:
        """Tell the other workers what `backend`'s health now is."""
        self.board.set_health(backend.index, _STATES.index(backend.health))

    def publish_cards(self) -> None:
        """Tell the other workers every discovered model card (before a backend is marked ready)."""
        cards = {b.name: [b.served_model_name, b.model_card] for b in self if b.model_card is not None}
        self._publish("model cards", self.board.write_cards, orjson.dumps(cards))

    def publish_loads(self) -> None:
        """Tell the other workers each backend's own /v1/loads, as the health checker polled it."""
        payload = orjson.dumps({b.name: engine_load_json(b.engine_load) for b in self})
        if self._publish("engine loads", self.board.write_loads, payload):
            # This process's own figures, not to be read back by its `sync` over newer ones it polled since.
            self._loads_version = self.board.loads_version

    def _publish(self, what: str, write: Callable[[bytes], None], payload: bytes) -> bool:
        """Write a blob for the other workers; one larger than the board's room is skipped (they keep
        the last that fitted; False) and logged when that starts and when it ends, never raised into
        the health checker, whose probes and polls must go on."""
        try:
            write(payload)
        except ValueError as exc:
            if what not in self._unshared:
                self._unshared.add(what)
                log.warning("not shared with the other workers: %s", exc)
            return False
        if what in self._unshared:
            self._unshared.discard(what)
            log.info("%s shared with the other workers again", what)
        return True

    def sync(self) -> None:
        """Take the health states, model cards and engine loads other processes published since the last call.

        A backend counts as ready here only once its model card has arrived too.
        """
        board = self.board
        if board.cards_version != self._cards_version:
            self._cards_version, payload = board.read_cards()
            for name, (served, card) in (orjson.loads(payload) if payload else {}).items():
                if name in self._backends:
                    self._backends[name].served_model_name, self._backends[name].model_card = served, card
        if board.loads_version != self._loads_version:
            self._loads_version, payload = board.read_loads()
            for name, load in (orjson.loads(payload) if payload else {}).items():
                if name in self._backends:
                    self._backends[name].engine_load = parse_engine_load(load)
        version = board.health_version
        if version != self._health_version:
            self._health_version = version
            for backend in self._backends.values():
                state = _STATES[board.health(backend.index)]
                if state is not Health.READY or backend.model_card is not None:
                    backend.health = state

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._backends.values())

    def __getitem__(self, name: str) -> Backend:
        return self._backends[name]

    def __contains__(self, name: str) -> bool:
        return name in self._backends

    @property
    def names(self) -> list[str]:
        return list(self._backends)

    @property
    def total_inflight(self) -> int:
        """Requests in flight across the whole gateway (every worker)."""
        return sum(b.inflight_total for b in self._backends.values())

    @property
    def own_inflight(self) -> int:
        """Requests in flight in this process (the same as `total_inflight` with one worker)."""
        return sum(b.inflight for b in self._backends.values())

    def shares_group(self, backend: Backend) -> bool:
        """True when another backend is in `backend`'s group (else the group's load is the backend's)."""
        return self._group_sizes.get(backend.group, 1) > 1

    def group_load_area(self, group: str, now: float) -> float:
        """Integral of the in-flight count of `group`'s backends from process start to `now`."""
        return sum(b.load_area(now) for b in self._backends.values() if b.group == group)

    def group_sent_prompt_tokens(self, group: str) -> float:
        """Prompt tokens every request routed to `group`'s backends was sent to prefill, ever (as each one's
        `sent_prompt_tokens_total`)."""
        return sum(b.sent_prompt_tokens_total for b in self._backends.values() if b.group == group)

    def snapshot(self) -> PoolSnapshot:
        """The current state as plain data for a policy."""
        self.sync()
        now = self.clock()
        return PoolSnapshot(tuple(b._view() for b in self._backends.values()), now)

    def acquire(self, name: str, max_tokens: int | None = None, weight: int = 1, prompt_tokens: float = 0.0, streamed: bool = False) -> Slot:
        """Take an in-flight slot on backend `name`; `max_tokens`: the request's limit on its output (per
        sequence), if any; `weight`: the sequences it runs upstream (1 but for batched native requests);
        `prompt_tokens`: those of its prompt `name` is predicted to prefill (per sequence); `streamed`: its
        tokens will be marked as they come (`Slot.mark_token`), so its prompt counts as prefilled at the first."""
        return Slot(self, self._take(name, weight), max_tokens, weight, prompt_tokens, streamed)

    def record_output(self, name: str, tokens: int) -> None:
        """A response of `tokens` output tokens finished on `name`: update its mean length (EWMA)."""
        backend = self._backends[name]
        mean = backend.mean_output_tokens
        backend.mean_output_tokens = float(tokens) if mean is None else mean + OUTPUT_EWMA * (tokens - mean)

    def record_prompt(self, name: str, tokens: int, cached: int, predicted: float) -> None:
        """A response on `name` reported `tokens` prompt tokens, `cached` of them from its prefix cache,
        where the prefix map had predicted `predicted`."""
        backend = self._backends[name]
        backend.prompt_tokens += tokens
        backend.cached_tokens += cached
        backend.predicted_tokens += predicted
        board, i = backend.board, backend.index
        board.write(i, PROMPT, backend.prompt_tokens)
        board.write(i, CACHED, backend.cached_tokens)
        board.write(i, PREDICTED, backend.predicted_tokens)

    def prompt_totals(self, name: str) -> tuple[float, float, float]:
        """The whole gateway's (prompt, cached, predicted) tokens of `name`'s finished responses."""
        backend = self._backends[name]
        board, i = backend.board, backend.index
        return board.total(i, PROMPT), board.total(i, CACHED), board.total(i, PREDICTED)

    def _take(self, name: str, weight: int = 1) -> Backend:
        backend = self._backends[name]
        backend._change(+weight)
        backend.served += 1
        backend.board.write(backend.index, SERVED, backend.served)
        self._idle.clear()
        return backend

    def _release(self, backend: Backend, weight: int = 1) -> None:
        backend._change(-weight)
        if self.own_inflight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight in this process; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def wait_gateway_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight in the whole gateway: this process's requests, then every
        other worker's as the board counts them (polled); False if `timeout` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not await self.wait_idle(timeout):
            return False
        while self.total_inflight > 0:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_BOARD_POLL)
        return True
