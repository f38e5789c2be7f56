"""The routing decision: the `Policy` interface, `Decision`, `Completion`, and `route`.

A policy has three steps, each called from one place: `choose(snapshot, tier)`, a pure function of
a `PoolSnapshot`, the request's service tier and what it has learned (so each rule can be tested
with plain data); `routed(snapshot, decision)`, once per request after its slot was taken;
`observe(completion)`, learning from a finished response. `route` adds what every policy shares
(the forced-route header, falling back when the chosen backend cannot serve); `failover` moves a
request whose backend could not be reached. One module per policy beside this face: `static.py`
(threshold, spill), `adaptive/`, `lane.py` (the tiers' lane), `factory.py` (`make_policy`).
May import `gateway.pool`, `gateway.tiers` and `gateway.config`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.policies.lane import TierLane
from gateway.pool.snapshot import PoolSnapshot
from gateway.tiers import DEFAULT, Tier

MODE_EAGLE, MODE_PLAIN = "eagle", "plain"  # x-specgate-route values that name a mode, not a backend
FAILOVER = "failover_retry"  # the reason label of a request moved after a connection failure


@dataclass(frozen=True)
class Decision:
    """Where a request goes, which rule sent it there, and the service tier it was decided for.

    `then`: the backend that takes a stream over after its first token (a handover: `backend` holds
    more of its prompt and answers the first token sooner, `then` decodes the rest faster); None: it
    stays where it starts.
    """

    backend: str
    reason: str
    tier: Tier = DEFAULT
    then: str | None = None

    @property
    def decodes_on(self) -> str:
        """The backend that decodes the answer: `then` after a handover, else `backend`."""
        return self.then if self.then is not None else self.backend

    @property
    def label(self) -> str:
        """The `reason` metric label: the rule, prefixed by the tier for priority and flex requests."""
        return self.reason if self.tier == DEFAULT else f"{self.tier}:{self.reason}"


@dataclass(frozen=True)
class Prompt:
    """What a policy knows of a request's prompt: its estimated length, how much of it each backend is
    predicted to hold in its prefix cache (pool/prefix.py), and the output it asks for at most."""

    tokens: float
    cached: Mapping[str, float] = field(default_factory=dict)  # backend -> predicted cached tokens
    max_tokens: int | None = None  # the request's limit on its output, when it gave one
    most_tokens: float | None = None  # the most it is likely to hold (None: `tokens`), for KV fit
    # Seconds since the longest prefix of it some backend holds was last sent (None: none holds any): how
    # far apart the requests building on that prefix come.
    since_sent: float | None = None

    def uncached(self, backend: str) -> float:
        """The prompt tokens `backend` would have to prefill."""
        return max(self.tokens - self.cached.get(backend, 0.0), 0.0)


@dataclass(frozen=True)
class Completion:
    """What the gateway observed about one finished response; fed back to the policy.

    A response not streamed has no chunk times: its `ttft` is its whole life (arrival to the body),
    `decode_seconds` 0, the mean loads 0 and `token_chunks` 0 (`streamed` is False). A stream handed over
    after its first token (`given` > 0) tells what its last backend did: `ttft` to that backend's first
    token, the chunks and window since, no prompt (0: that backend was given the earlier output too), and
    the whole answer's `output_tokens`."""

    backend: str
    output_tokens: int
    ttft: float  # seconds from arrival to the first content chunk
    decode_seconds: float  # first to last content chunk
    mean_inflight: float  # the backend's mean in-flight count while this request decoded
    mean_group_inflight: float  # the same for all backends of its group (those sharing its GPUs)
    token_chunks: int = 0  # stream chunks that carried generated tokens (EAGLE: tokens / chunks = acceptance length)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the backend reported it took from its prefix cache
    given: int = 0  # output tokens earlier backends produced (a moved stream), in `output_tokens`
    # Prompt tokens other requests of its group were sent to prefill while it decoded (a stream's counted at
    # its first token, another's when routed): their prefill steps ran between its decode steps, inside
    # `decode_seconds`.
    group_prompt_tokens: float = 0.0

    @property
    def decoded(self) -> int:
        """Output tokens `backend` generated."""
        return self.output_tokens - self.given

    @property
    def streamed(self) -> bool:
        """Whether its tokens' times are known (a stream with a decode window)."""
        return self.decode_seconds > 0.0

    @property
    def first_token_seen(self) -> bool:
        """Whether `ttft` is the time to the first token: a stream's, or a one-token response's life."""
        return self.streamed or self.output_tokens == 1


@dataclass(frozen=True)
class Progress:
    """A stretch of a response still streaming, fed back as it goes (a long response teaches before it
    ends): `chunks` token-bearing chunks over `seconds` on `backend`, under the mean loads shown."""

    backend: str
    seconds: float
    chunks: int
    mean_inflight: float
    mean_group_inflight: float
    group_prompt_tokens: float = 0.0  # as `Completion`'s, over this stretch


@dataclass(frozen=True)
class Running:
    """A request decoding, as a policy may move it to another backend: `key` names it to the caller; its
    backend, the token-bearing chunks it has had there, its output limit there (None: none given), its
    prompt's tokens, each backend's predicted hold of them, and the output tokens earlier backends gave
    it (a stream moved before: they are in the prompt its backend continued, and a move prefills them too)."""

    key: str
    backend: str
    chunks: int
    max_tokens: int | None
    prompt_tokens: float
    cached: Mapping[str, float] = field(default_factory=dict)
    given: int = 0


@dataclass(frozen=True)
class DrainMark:
    """A response ended `at` (the pool's clock) when the gateway had made `decisions` routing decisions;
    the policy asks to be shown the running requests `after` seconds later (`Policy.drain_moves`)."""

    at: float
    decisions: int
    after: float


class Policy(ABC):
    """Routing policy interface."""

    name: str
    lane: TierLane | None = None  # the service tiers' lane, for a policy that keeps one
    move_running: bool = False  # `moves` may move streams: the exchange keeps what they relayed

    @abstractmethod
    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        """Pick a backend for one more request of service tier `tier`, given the pool as it is now
        (before adding it) and, when the gateway could read one, its prompt.

        Pure: reads the snapshot and the policy's beliefs, changes neither.
        """

    def routed(self, snapshot: PoolSnapshot, decision: Decision, prompt: Prompt | None = None) -> None:  # noqa: B027 - static policies keep no state
        """Record a request placed as `decision` says on the pool `snapshot` showed; once per request.

        Called for the policy's own decisions (fallback and failover included), never for forced routes;
        `decision.tier` is the request's service tier, `prompt` what `choose` was told of its prompt.
        """

    def observe(self, completion: Completion) -> None:  # noqa: B027 - static policies learn nothing
        """Learn from a finished response."""

    def paced(self, progress: Progress) -> None:  # noqa: B027 - static policies learn nothing
        """Learn from a stretch of a response still streaming (the response's `Completion` follows)."""

    def may_move(self, decision: Decision) -> bool:
        """Whether `moves` may move anything right after `decision` (the caller lists its running requests
        only then). Static policies move none."""
        return False

    def moves(self, snapshot: PoolSnapshot, decision: Decision, running: Sequence[Running]) -> list[str]:
        """Right after `decision` was routed (`routed` called): the keys of the `running` requests to move
        to `decision.decodes_on`, each continued there from the output it has had. Static policies move none."""
        return []

    def drain_mark(self, at: float) -> DrainMark | None:
        """A response ended at `at`: when to offer `drain_moves` the running requests (None: never; static
        policies move none)."""
        return None

    def drain_moves(self, snapshot: PoolSnapshot, mark: DrainMark, running: Sequence[Running]) -> list[tuple[str, str]]:
        """`mark.after` seconds after a response ended: the `running` requests to move, as (key, backend to
        go on on), each continued there from the output it has had."""
        return []

    def attach(self, snapshot: Callable[[], PoolSnapshot]) -> None:  # noqa: B027 - static policies need no live view
        """Give the policy a live view of the pool, for beliefs that depend on the current load."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Policy name, parameters and beliefs, for /admin/status."""

    def predicted_tpot(self, snapshot: PoolSnapshot, backend: str) -> float | None:
        """Seconds per output token it predicts for one more request on `backend` at `snapshot`'s load
        (a trace's routing span reports it); None: it predicts none."""
        return None

    def tiers(self) -> dict[str, Any] | None:
        """The service tiers' state (the lane priority traffic keeps), for /admin/status; None: no tiers."""
        return None


def route(
    policy: Policy,
    snapshot: PoolSnapshot,
    forced: str | None = None,
    tier: Tier = DEFAULT,
    prompt: Prompt | None = None,
    *,
    handover: bool = False,
) -> Decision | None:
    """Decide for one request of service tier `tier` (and `prompt`, when known); None when no backend can serve it.

    `forced` (the x-specgate-route header, already validated) wins when it can be served: a backend
    name, that backend; `eagle` or `plain` naming no backend, that mode (its least-loaded available
    backend). A forced request is never silently moved, so it gets None otherwise. A decision to hand
    the request over after its first token (`Decision.then`) stands only while `then` is available
    (else the request stays where it starts) and with `handover`, the caller able to move this
    request's stream (else it starts on `then`).
    """
    if forced is not None:
        target = forced_backend(snapshot, forced)
        return Decision(target, "forced", tier) if target is not None else None
    decision = policy.choose(snapshot, tier, prompt)
    if decision.then is not None:
        if not snapshot.get(decision.then).available:
            decision = replace(decision, then=None)
        elif not handover:
            decision = replace(decision, backend=decision.then, then=None)
    if snapshot.get(decision.backend).available:
        return replace(decision, tier=tier)
    for other in snapshot.backends:
        if other.available:
            return Decision(other.name, "fallback_unavailable", tier)
    return None


def forced_backend(snapshot: PoolSnapshot, forced: str) -> str | None:
    """The available backend a forced route names (see `route`), or None."""
    names = {b.name for b in snapshot.backends}
    if forced in names:
        return forced if snapshot.get(forced).available else None
    mode = [b for b in snapshot.backends if b.available and b.speculative == (forced == MODE_EAGLE)]
    if forced not in (MODE_EAGLE, MODE_PLAIN) or not mode:
        return None
    return min(mode, key=lambda b: (b.inflight, snapshot.group_inflight(b), b.name)).name


def failover(
    policy: Policy, snapshot: PoolSnapshot, failed: str, tier: Tier = DEFAULT, prompt: Prompt | None = None
) -> Decision | None:
    """Where a request goes after `failed` refused its connection (already marked down in `snapshot`).

    The policy decides again on the pool as it is now; None when that leaves no other backend.
    """
    decision = route(policy, snapshot, tier=tier, prompt=prompt)
    if decision is None or decision.backend == failed:
        return None
    return Decision(decision.backend, FAILOVER, tier)
