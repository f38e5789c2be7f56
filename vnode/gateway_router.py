"""specgate's routing in virtual time: the gateway's own pool, policy and feedback, fed as the gateway feeds them.

Per request, what `gateway/proxy/admission.py` and `exchange.py` do: the in-flight limit and the
service tier's admission, the prompt's prefix matched in the pool's prefix map, then
`route(policy, pool.snapshot(), tier=..., prompt=..., handover=True)` (every request here is a
stream that can go on elsewhere), `Pool.acquire` (with the request's `max_tokens` and the prompt
tokens it is predicted to prefill there), the prefix inserted for the chosen backend, and
`policy.routed`; a decision's handover (`Decision.then`) moves the request at its first token, as
the exchange's handoff does; `Slot.mark_token` per token-bearing
chunk, each stretch of progress it reports learned at once; at the end the usage (`Pool.record_output`) and, for a
stream of at least two tokens, the `Completion` the relay builds from the slot's decode window,
learned then (one worker: the board's ring replays each record to the policy as it is recorded); the
slot is released last. The pool runs on the
model's clock; every backend is ready from the start, as the envelope waits for them to be, and its
`/v1/loads` (KV capacity, prefill counters, decode moments) is its engine's at the health checker's
last poll.

The node's hop (the request path's cost, each way) lies between the gateway and its servers: the
gateway stamps a request's arrival before it parses, routes and forwards it, and the server reads and
tokenizes it before its prefill, so a TTFT the gateway measures spans the path both ways (real time,
llama8b-h100 multi-turn at time scale 3: the load tool's TTFT p50 exceeds the gateway's by 1 of the
5 model ms the path adds). The adaptive policy prices a prompt's prefill from those TTFTs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.sim.core import EngineCore
from gateway.config import HealthConfig
from gateway.errors import OpenAIError
from gateway.dialects.openai import messages_text
from gateway.policies import Completion, Decision, DrainMark, Policy, Progress, Prompt, Running, route
from gateway.pool.backends import Backend, DecodeWindow, Health, Pool, Slot
from gateway.pool.engine_load import EngineLoad
from gateway.pool.prefix import PrefixEstimate, PromptKey
from gateway.tiers import DEFAULT, admit_tier, requested_tier
from vnode.requests import Request
from vnode.router import DrainLook, Refused


TEACH_RESPONSES = 4  # `GatewayRouter.teach`'s responses per load: enough for a band to be a point of a curve


@dataclass(frozen=True)
class BackendSpec:
    """One backend as the gateway lists it: its name, kind and GPU group."""

    name: str
    speculative: bool
    group: str


@dataclass(slots=True)
class _Flight:
    slot: Slot
    arrived: float
    key: PromptKey | None = None
    prompt: Prompt | None = None
    first_token_at: float | None = None
    token_chunks: int = 0
    handover: bool = False  # started where it is to be handed over from after its first token
    moved: bool = False  # continued on another backend
    teaches: bool = True  # unmoved, or moved only by its handover (as the exchange's `_teaches`)
    given: int = 0  # output tokens earlier servers gave it (in its continued prompt)
    segment_at: float | None = None  # its first token from the backend it moved to
    chunks_before: int = 0  # token chunks relayed before it moved


class GatewayRouter:
    """Routes with a real `gateway.policies` policy over a real `gateway.pool.Pool`; see the module docstring."""

    def __init__(
        self,
        policy: Policy,
        backends: Sequence[BackendSpec],
        clock: Callable[[], float],
        *,
        inflight_limit: int,
        flex_share: float,
        hop: float = 0.0,
    ) -> None:
        """`hop`: the node's, in seconds each way (see the module docstring)."""
        self.policy = policy
        self.pool = Pool(
            [Backend(b.name, f"vnode:{b.name}", b.speculative, group=b.group, health=Health.READY) for b in backends],
            clock=clock,
        )
        if policy.lane is not None:
            policy.lane.share(self.pool.board)
        policy.attach(self.pool.snapshot)
        self.inflight_limit = inflight_limit
        self.flex_share = flex_share
        self.hop = hop
        self._index = {b.name: i for i, b in enumerate(backends)}
        self._flights: dict[str, _Flight] = {}
        self.prefix_estimate = PrefixEstimate(len(backends))
        self.ready_interval = HealthConfig().ready_interval  # the health checker's `/v1/loads` poll period
        self._cores: tuple[EngineCore, ...] = ()
        self._next_poll: float | None = None
        self._moving: list[tuple[str, int]] = []

    def engines_attached(self, cores: Sequence[EngineCore]) -> None:
        """The servers' engine cores, in the pool's order: each backend's `/v1/loads` is then what its engine
        reports at the health checker's polls (every `ready_interval`, the first at once), taken at the
        first routing after each poll instant."""
        self._cores = tuple(cores)
        self._next_poll = None
        self._poll(0.0)

    def teach(self, prompt_tokens: int, output_tokens: int) -> None:
        """A what-if: the policy starts knowing each server's curve. Every backend's policy sees, as completions of
        requests of `prompt_tokens` and `output_tokens` alone on their group, `TEACH_RESPONSES` responses at each
        load a quarter octave apart from one to its engine's running cap, heaviest first; each one's time per
        token is its engine's decode steps at that load plus, once in its life, the prefill of each request
        decoding beside it (an open loop's steady state). Needs `engines_attached` first."""
        for backend, core in zip(self.pool, self._cores, strict=True):
            table = core.table
            cap = table.max_running_requests
            for n in sorted({min(cap, round(2 ** (i / 4))) for i in range(4 * cap.bit_length() + 1)}, reverse=True):
                steps = (output_tokens - 1) / table.tokens_per_step(n)
                prefill = table.prefill_ms_per_token * prompt_tokens
                decode = (steps * table.step_ms(n) + n * prefill) / 1000.0
                completion = Completion(
                    backend.name, output_tokens, ttft=(prefill + table.step_ms(n)) / 1000.0, decode_seconds=decode,
                    mean_inflight=float(n), mean_group_inflight=float(n), token_chunks=1 + round(steps),
                    prompt_tokens=prompt_tokens,
                )
                for _ in range(TEACH_RESPONSES):
                    self.policy.observe(completion)

    def _poll(self, now: float) -> None:
        if not self._cores or (self._next_poll is not None and now < self._next_poll):
            return
        for backend, core in zip(self.pool, self._cores, strict=True):
            moments = core.decode_moments
            report = {
                "dp_rank": 0,
                "max_total_num_tokens": core.table.max_total_tokens,
                "total_prefill_uncached_tokens": core.prefill_tokens_total,
                "total_prefill_busy_us": int(core.prefill_busy_seconds * 1e6),
                "decode_moments": list(moments) if moments[0] > 0 else None,
            }
            backend.engine_load = EngineLoad(None, None, 1, (report,))
        step = self.ready_interval
        nxt = now + step if self._next_poll is None else self._next_poll
        while nxt <= now:
            nxt += step
        self._next_poll = nxt

    def route(self, request: Request, now: float) -> int:
        self._poll(now)
        pool = self.pool
        inflight = pool.total_inflight
        try:
            if inflight >= self.inflight_limit:
                raise OpenAIError(429, "too many requests in flight, retry shortly", code="overloaded")
            tier = requested_tier(request.service_tier, None) or DEFAULT
            admit_tier(tier, inflight, self.inflight_limit, self.flex_share)
        except OpenAIError as err:
            raise Refused(err.status, err.message) from None
        key = PromptKey.of(messages_text([{"role": role, "content": content} for role, content in request.messages]))
        prompt = self._prompt(key, request.max_tokens, now)
        snapshot = pool.snapshot()
        decision = route(self.policy, snapshot, None, tier, prompt, handover=True)
        if decision is None:
            raise Refused(503, "no backend is ready to serve")
        slot = pool.acquire(decision.backend, request.max_tokens, prompt_tokens=prompt.uncached(decision.backend) if prompt else 0.0, streamed=True)
        if key is not None:
            pool.board.prefix.insert(key.keys, slot.backend.index, now)
        slot.on_progress = self._progress
        self.policy.routed(snapshot, decision, prompt)
        self._flights[request.rid] = _Flight(slot, now, key, prompt, handover=decision.then is not None)
        self._moving = self._moves(request.rid, decision) if self.policy.may_move(decision) else []
        if decision.then is not None:  # the exchange's handover: moved at its first token
            self._moving.append((request.rid, self._index[decision.then]))
        return self._index[decision.backend]

    def take_moves(self) -> list[tuple[str, int]]:
        """The requests the last routing decision moves, as (rid, index of the server they go to)."""
        moving, self._moving = self._moving, []
        return moving

    def _moves(self, routed: str, decision: Decision) -> list[tuple[str, int]]:
        """What the exchange does after a group switch: ask the policy which running requests follow it
        (those streaming: not `routed`, the request just placed)."""
        keys = self.policy.moves(self.pool.snapshot(), decision, self._running(routed))
        return [(rid, self._index[decision.decodes_on]) for rid in keys]

    def _running(self, routed: str | None = None) -> list[Running]:
        """The requests streaming as the exchange lists them (its slot's chunks and limit, the prompt admission
        estimated), but `routed`."""
        return [
            Running(rid, f.slot.backend.name, f.slot.chunks, f.slot.max_tokens, f.prompt.tokens if f.prompt else 0.0, f.prompt.cached if f.prompt else {}, f.given)
            for rid, f in self._flights.items()
            if rid != routed
        ]

    def drain_look(self, now: float) -> DrainLook | None:
        """The gateway's drain watch: the policy's mark, looked at when it says, while requests still stream."""
        mark = self.policy.drain_mark(now) if self._flights else None
        return DrainLook(now + mark.after, mark) if mark is not None else None

    def drain(self, look: DrainLook) -> list[tuple[str, int]]:
        assert isinstance(look.mark, DrainMark)
        if not self._flights:
            return []
        moves = self.policy.drain_moves(self.pool.snapshot(), look.mark, self._running())
        return [(rid, self._index[to]) for rid, to in moves]

    def moved(self, request: Request, to: int, produced: int, now: float) -> None:
        """`request` goes on at server `to` with `produced` output tokens given back: its slot moves there."""
        flight = self._flights[request.rid]
        flight.slot.continue_on(self.pool.names[to], max(request.max_tokens - produced, 1))
        if flight.key is not None:
            self.pool.board.prefix.insert(flight.key.keys, flight.slot.backend.index, now)
        flight.teaches = flight.handover and not flight.moved
        flight.moved = True
        flight.given = produced
        flight.segment_at = None
        flight.chunks_before = flight.token_chunks

    def resent(self, request: Request, to: int, now: float) -> None:
        """`request`, which had no token yet, was sent whole to server `to`: its slot moves there, as a failover's."""
        flight = self._flights[request.rid]
        flight.slot.move_to(self.pool.names[to])
        if flight.key is not None:
            self.pool.board.prefix.insert(flight.key.keys, flight.slot.backend.index, now)
        flight.handover = False
        flight.teaches = False  # as the exchange's resent answer

    def _prompt(self, key: PromptKey | None, max_tokens: int, now: float) -> Prompt | None:
        """What admission tells the policy of a prompt: its length, each backend's predicted hold and how
        long ago that prefix was last sent."""
        if key is None:
            return None
        names = self.pool.names
        prefixes = self.pool.board.prefix
        held = prefixes.match(key.keys, len(names))
        estimate = self.prefix_estimate
        cached = {name: estimate.cached_tokens(i, n) for i, (name, n) in enumerate(zip(names, held, strict=True)) if n}
        sent = prefixes.sent_at(key.keys, max(held, default=0))
        since = now - sent if sent is not None else None
        return Prompt(estimate.prompt_tokens(key.size), cached, max_tokens, estimate.most_tokens(key.size), since)

    def _progress(self, backend: str, window: DecodeWindow) -> None:
        self.policy.paced(Progress(backend, window.seconds, window.chunks, window.mean_inflight, window.mean_group_inflight, window.group_prompt_tokens))

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        flight = self._flights[request.rid]
        flight.slot.mark_token(now)
        if flight.first_token_at is None:
            flight.first_token_at = now
        if flight.moved and flight.segment_at is None:
            flight.segment_at = now
        flight.token_chunks += 1

    def finish(self, request: Request, now: float, output_tokens: int | None, cached_tokens: int = 0) -> None:
        flight = self._flights.pop(request.rid)
        slot = flight.slot
        if output_tokens is not None:
            name = slot.backend.name
            self.pool.record_output(name, output_tokens)
            if flight.key is not None and flight.prompt is not None and not flight.moved:  # the exchange's usage accounting
                predicted = flight.prompt.cached.get(name, 0.0)
                self.pool.record_prompt(name, request.prompt_tokens, cached_tokens, predicted)
                self.prefix_estimate.learn(slot.backend.index, flight.key.size, request.prompt_tokens, predicted, cached_tokens)
            window = slot.decode_window()
            first = flight.segment_at if flight.moved else flight.first_token_at
            if output_tokens - flight.given >= 2 and window is not None and first is not None and flight.teaches:
                prompt, cached = (0, 0) if flight.moved else (request.prompt_tokens, cached_tokens)
                self.policy.observe(
                    Completion(
                        backend=name,
                        output_tokens=output_tokens,
                        ttft=first - flight.arrived + 2 * self.hop,
                        decode_seconds=window.seconds,
                        mean_inflight=window.mean_inflight,
                        mean_group_inflight=window.mean_group_inflight,
                        token_chunks=flight.token_chunks - flight.chunks_before,
                        prompt_tokens=prompt,
                        cached_tokens=cached,
                        given=flight.given,
                        group_prompt_tokens=window.group_prompt_tokens,
                    )
                )
        slot.release()
