"""The adaptive policy: send each request where it is predicted to decode fastest.

Each backend has a `TpotEstimator` (`fit.py`) of its time per output token as a function of its
group's in-flight count, fitted from the responses the gateway relays; each EAGLE backend's
acceptance length tau and each group's recent load are learned from the same completions. Rules, in
order, each with its own reason label: one backend left (`adaptive_unavailable`); while fits are
missing, measure unfitted backends on idle groups and let a lone request speculate
(`adaptive_prior`, `adaptive_explore`); probe a kind unused for its interval on an idle group while
the fits leave it in the running, or never measured alone (`adaptive_explore`, backing off while
probes agree); with a TPOT target no backend meets, the least harm (`adaptive_slo`); otherwise the
(group, mode) rule of `rules.py`, and a request it sends to EAGLE is answered its first token by the
plain server of its group when that one holds far more of its prompt (`rules.first_token_server`, a
handover). `choose` only reads; `routed` stores what a decision changes. Service tiers: priority
requests are never probes and see the true predictions, default and flex leave the lane
(`rules.lane_view`), flex goes to plain decode. Rules and numbers: docs/adaptive.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gateway.config import PolicyConfig
from gateway.policies import Completion, Decision, DrainMark, Policy, Progress, Prompt, Running
from gateway.policies.adaptive.arms import (
    PROBE_AGREEMENT,
    Arm,
    KindCurves,
    KindLine,
    Outlook,
    crossover,
    group_beliefs,
    in_the_running,
    listed_arm,
)
from gateway.policies.adaptive.fit import Curve, EstimatorConfig, TpotEstimator
from gateway.policies.adaptive.forecast import LoadForecast
from gateway.policies.adaptive.rules import (
    DRAIN_QUIET,
    DRAIN_TAIL,
    GROUP_SWITCH,
    KV_ROOM,
    BackendState,
    PromptCost,
    GroupState,
    Stray,
    drain,
    first_token_server,
    flex_choice,
    lane_view,
    least_harm,
)
from gateway.policies.adaptive.engine import EnginePrefill, EngineSteps, SentPrompts, StepReading
from gateway.policies.adaptive.rules import choose as choose_group
from gateway.policies.adaptive.rules import moves as stray_moves
from gateway.policies.lane import FLEX_PLAIN, TierLane, TierSettings
from gateway.pool.snapshot import BackendView, PoolSnapshot
from gateway.tiers import DEFAULT, FLEX, PRIORITY, Tier

# Weak prior that speculation is the faster choice for the first requests: EAGLE's prediction is
# scaled by 1 - SPEC_PRIOR * w0 / (w0 + evidence), fading as its evidence (in full-length
# responses) grows. It keeps one noisy short warm-up response from parking a lone request on the
# plain server until the next probe.
SPEC_PRIOR = 0.2
SPEC_PRIOR_WEIGHT = 1.0
# The prior slope of plain decode's line, per request, relative to its intercept (EAGLE's is the estimator's
# default): until responses at several loads shape it, plain's line extrapolates nearly flat.
PLAIN_PRIOR_SLOPE = 0.01
# A decode window is taken to have spent at least this share of its time decoding, whatever the prefill
# counted in it (streams whose first tokens came in the step that began it count in the order their chunks
# are relayed, though that step ran their prefill before the window).
DECODE_FLOOR = 0.25
# Co-located: a response counts only if the other server had at most this many requests in flight
# on average while it decoded.
SHARED_TOLERANCE = 0.25
# A probe costs one request's slowdown when partitioned, but co-located its steps slow every request
# on the other server for as long as it decodes, and traffic that arrives meanwhile makes its
# response unusable. Probes that teach nothing new therefore back off exponentially, to at most this
# many intervals (docs/adaptive.md#the-decision).
PROBE_BACKOFF_LIMIT = 16
# A probe of a co-located group is sent only while a group is expected to serve, and has been serving
# for a few lives, about one request at a time: a probe that lands at the start of a burst, or in a
# lull between bursts, mixes the modes for its whole life, and the arrivals it slows hold the
# group's share of the load back (docs/adaptive.md#the-decision).
PROBE_MAX_LOAD = 2.0
# A kind whose curve starts above this load was never measured on a request alone: below it the curve
# is its prior slope carried down from a busy moment, which can price the kind out at light load for
# good (nothing goes there, so nothing corrects it). It is probed at each quiet moment, whatever the
# fits say, until its lone responses are a point of its curve; after a probe that taught nothing, only
# once its backoff has added to the interval.
LONE_LOAD = 1.5
# Weight of each response in the mean output length and the prefill cost per token.
OUTPUT_RATE = 0.05
# The most later requests a placement is priced for (`PromptCost.reuse`): the load a decision sees holds
# for about as many lives as a group's mode switch is weighed over.
REUSE_HORIZON = 4.0
# Under light traffic a co-located group runs the mode its arrival rate wants (`GroupState.offered`) where
# a prefix is reused at least this many times: each change of mode then strands the prefixes the other
# server holds. Where prompts share little, each lone request's mode may follow the load of its moment.
RATE_REUSE = 1.0
# Where prompts share little, a request's price counts the step in progress it waits out once when it joins
# (`_join_wait`), once this many responses have told how much of their prompts was cached: before, the
# traffic's reuse is not known.
REUSE_KNOWN = 32
# A response teaches the prefill cost only when it had at least this many prompt tokens to prefill:
# shorter, its time to first token is mostly the step it joined, not its prompt.
PREFILL_MIN_TOKENS = 256
# A response's end is followed by a look for a drain (rule 9) this share of a mean life later: a closed
# loop's client sends its next request by then, so its completions do not read as its traffic stopping.
DRAIN_WAIT = 1.0 / 32.0
# A request short of KV room where it would go goes to a server of that kind in another group where it is
# predicted to wait less than this share as long. The estimate is rough (requests end unevenly), so only a
# clearly shorter wait moves it off the load's choice.
ROOM_WAIT_SHARE = 0.5
# A server's in-flight requests are taken to end evenly over this many times the mean output they have left.
DRAIN_SPREAD = 2.0
# Decisions that do not set a group's mode: a probe measures the other mode on an idle group, and a
# capped or cold-start request goes where there is room or a measurement to take.
_NOT_A_MODE = (
    "adaptive_explore", "adaptive_cap", "adaptive_prior", "adaptive_unavailable", "adaptive_prefix_beside", "adaptive_kv_fit", KV_ROOM,
)
# Decisions whose request must be answered whole where it goes: a probe's or cold start's response measures
# that backend, and only that backend's KV cache holds a `adaptive_kv_fit` one.
_OWN_RESPONSE = ("adaptive_explore", "adaptive_prior", "adaptive_kv_fit", "adaptive_unavailable")


class AdaptivePolicy(Policy):
    """Routes by predicted time per output token across K groups; learns each backend's TPOT(n) online."""

    name = "adaptive"

    def __init__(
        self,
        eagle_cap: int = 128,
        *,
        slo_tpot: float | None = None,
        probe_every: int = 200,
        colocated: bool = False,
        estimator: EstimatorConfig | None = None,
        tiers: TierSettings | None = None,
        move_running: bool = True,
        handover: bool = True,
        drain: bool = True,
    ) -> None:
        """`eagle_cap`: most requests each EAGLE backend gets at once; `slo_tpot`: target seconds per
        token (None: off); `probe_every`: decisions without traffic after which a backend of an
        idle group is probed; `colocated`: the backends share GPUs (a response decoded alongside
        another backend's requests is never learned from); with it off, the snapshot's groups say
        which backends share GPUs; `tiers`: the lane priority traffic keeps; `move_running`: a group's
        switch moves its strays (`moves`); `handover`: a stream whose prefix the plain server of its
        group holds is answered its first token there and decoded on EAGLE (`rules.first_token_server`);
        `drain`: a group whose requests stopped coming moves its long plain answers to EAGLE (`drain_moves`)."""
        if eagle_cap < 1:
            raise ValueError(f"eagle cap must be at least 1, got {eagle_cap}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be at least 1, got {probe_every}")
        if slo_tpot is not None and not slo_tpot > 0:
            raise ValueError(f"the TPOT target must be positive, got {slo_tpot}")
        self.cap = eagle_cap
        self.slo_tpot = slo_tpot
        self.probe_every = probe_every
        self.colocated = colocated
        self.move_running = move_running
        self.handover = handover
        self.drain = drain
        self.estimator = estimator or EstimatorConfig()
        self._arms: dict[str, Arm] = {}
        self._forecast = LoadForecast()  # the load over the next request life
        self._kinds = KindCurves()  # each kind's pooled curve
        self._scaled: tuple[int, dict[bool, Curve]] = (-1, {})  # ... as the rules see it, for a generation of them
        self._loads: tuple[PoolSnapshot | None, tuple[float, float, float]] = (None, (0.0, 0.0, 0.0))  # `_group_loads`' last reading
        self._prefill: dict[bool, float] = {}  # kind -> seconds to first token per uncached prompt token
        self._engine_prefill = EnginePrefill()  # ... as the engines count their prefill steps
        self._sent = SentPrompts()  # prompt tokens a routed request is sent to prefill
        self._prefill_ends: dict[str, float] = {}  # group -> when the prefill routed to it should be done (pool clock)
        self._streamed = self._unstreamed = 0  # responses seen, streamed and not
        self._engine_steps = EngineSteps()  # each engine's decode steps, for backends no stream teaches
        self._mean_output = 256.0  # tokens per response, until responses say otherwise
        # ... as it stood at the latest arrival: once requests stop, the responses still ending are the longest
        # of their traffic, and their mean would pass any answer for ordinary (rule 9's tail).
        self._arrival_output = self._mean_output
        self._footprint: float | None = None  # KV tokens a request holds: mean uncached prompt + output
        self._hit_share = 0.0  # mean share of a prompt its backend had cached
        self._hits_read = 0  # responses whose cached share it has read
        self._modes: dict[str, bool] = {}  # co-located group -> the kind its new requests last went to
        self._last: dict[str, str] = {}  # group -> its last decision, "backend: reason"
        self._drained: set[str] = set()  # plain servers whose group's streams went to EAGLE in a drain (rule 9)
        # The group the latest switch turned and the load it was priced at (rule 1's L): its strays are
        # judged at that load, or a switch priced at a forecast above the in-flight count could find its
        # mode slower for every stray and leave the modes mixed.
        self._switched: tuple[str, float] = ("", 0.0)
        self._live: Callable[[], PoolSnapshot] | None = None
        self.lane = TierLane(tiers)

    @classmethod
    def from_config(cls, config: PolicyConfig, tiers: TierSettings | None = None) -> AdaptivePolicy:
        """The policy as the `[policy]` table configures it (`tiers`: from its `tier_*` keys)."""
        slo = config.adaptive_slo_tpot_ms
        return cls(
            config.adaptive_eagle_cap,
            slo_tpot=slo / 1000.0 if slo is not None else None,
            probe_every=config.adaptive_probe_every,
            colocated=bool(config.adaptive_colocated),
            estimator=EstimatorConfig(half_life=config.adaptive_half_life),
            tiers=tiers,
            move_running=config.adaptive_move_running,
            handover=config.adaptive_handover,
            drain=config.adaptive_drain,
        )

    def attach(self, snapshot: Callable[[], PoolSnapshot]) -> None:
        self._live = snapshot

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        name, reason = self._decide(snapshot, tier, prompt)
        first = self._first_token_server(snapshot, name, reason, prompt)
        return Decision(first, reason, tier, then=name) if first is not None else Decision(name, reason, tier)

    def _first_token_server(self, snapshot: PoolSnapshot, name: str, reason: str, prompt: Prompt | None) -> str | None:
        """Where a request placed on `name` is answered its first token, when elsewhere (`rules.first_token_server`):
        never for a probe or a cold start (their responses measure the backend they went to) nor where
        only `name` holds the request."""
        if not (self.handover and self.move_running) or prompt is None or not prompt.cached or reason in _OWN_RESPONSE:
            return None
        if prompt.max_tokens is not None and prompt.max_tokens < 2:
            return None  # its first token is its answer
        members = [v for v in snapshot.backends if v.group == snapshot.get(name).group]
        states = [BackendState(v.name, v.group, v.speculative, v.available, v.inflight) for v in members]
        chosen = next(s for s in states if s.name == name)
        return first_token_server(chosen, states, {v.name: prompt.uncached(v.name) for v in members})

    def _decide(self, snapshot: PoolSnapshot, tier: Tier, prompt: Prompt | None) -> tuple[str, str]:
        available = [v for v in snapshot.backends if v.available]
        holding = _holding(available, prompt)
        if len(holding) < len(available):  # the others would refuse it: their KV cache cannot hold it
            available = holding
            if len(available) == 1:
                return available[0].name, "adaptive_kv_fit"
        if len(available) <= 1:
            fallback = available or sorted(snapshot.backends, key=lambda v: v.speculative)
            return fallback[0].name, "adaptive_unavailable"
        outlooks = {v.name: self._outlook(v) for v in available}
        kinds = self._kinds.of(available, outlooks)
        if not all(o.fitted for o in outlooks.values()):
            cold = self._cold(snapshot, available, outlooks, kinds)
            if cold is not None:
                return cold.backend, cold.reason
        probe = self._probe(snapshot, available, outlooks, kinds) if tier != PRIORITY else None
        if probe is not None:
            return probe.backend, probe.reason
        waiting = _waiting_for_room(available, prompt, self._mean_output, lambda v: self._drain_time(v, outlooks[v.name], kinds))
        states = [self._state(v, outlooks[v.name], kinds, full=v.name in waiting) for v in available]
        if tier != PRIORITY and self.lane.active:  # default and flex leave the lane to priority traffic
            states = lane_view(states, self.lane.settings)
        flex = flex_choice(states) if tier == FLEX else None
        if flex is not None:
            return flex, FLEX_PLAIN
        capped = not all(s.open or s.full for s in states)
        if self.slo_tpot is not None and not capped:  # a capped EAGLE: the cap rule decides
            harm = least_harm(snapshot, states, self.slo_tpot)
            if harm is not None:
                return harm
        name, reason = choose_group(states, self._groups(snapshot), self._prompt_cost(available, prompt), strays_follow=self.move_running)
        if reason == "adaptive_predicted_faster" and capped and self._capped_was_faster(states, name):
            reason = "adaptive_cap"
        return name, reason

    def routed(self, snapshot: PoolSnapshot, decision: Decision, prompt: Prompt | None = None) -> None:
        """Record per backend its kind, group and whether the group is shared, the decisions since it
        last got a request and a pending probe; per group the last decision placed there, the mode new
        requests go to and the prefill sent to it; the arrival. Tau, the fits and the mean life change only
        in `observe`."""
        chosen = snapshot.get(decision.decodes_on)
        self._queue_prefill(snapshot, snapshot.get(decision.backend), prompt)
        self._last[chosen.group] = f"{decision.decodes_on}: {decision.label}"
        self.lane.routed(decision.tier)
        if decision.reason == GROUP_SWITCH:  # read before the arrival moves the forecast
            self._switched = (chosen.group, max(snapshot.group_inflight(chosen) + 1.0, self._group_loads(snapshot)[0]))
        self._forecast.arrived(snapshot.at, snapshot.total_inflight, self.lane.clock.decisions())
        self._arrival_output = self._mean_output
        self._sent.read(snapshot)
        sizes = Counter(v.group for v in snapshot.backends)
        if sizes[chosen.group] > 1 and decision.reason not in _NOT_A_MODE:
            self._modes[chosen.group] = chosen.speculative
            if chosen.speculative:  # the drained streams are where the group's new requests go
                self._drained.difference_update(v.name for v in snapshot.backends if v.group == chosen.group)
        steps = Counter[str]()  # decode steps reported per group
        for view in snapshot.backends:
            steps[view.group] += view.decode_moments[0] if view.decode_moments is not None else 0.0
        for view in snapshot.backends:
            self._engine_prefill.read(view)
            arm = self._sync(view)
            arm.shared = sizes[view.group] > 1
            own = view.decode_moments[0] if view.decode_moments is not None else 0.0
            self._learn_steps(arm, self._engine_steps.read(view, steps[view.group] - own))
            if view.name == decision.decodes_on:
                if decision.reason == "adaptive_explore" and arm.estimator.fitted:
                    arm.probe_pending = True  # a probe of a known backend, not a cold-start measurement
                arm.since_routed = 0
            else:
                arm.since_routed += 1

    def _queue_prefill(self, snapshot: PoolSnapshot, first: BackendView, prompt: Prompt | None) -> None:
        """The prompt's uncached tokens join its first-token server's group's prefill queue, drained at the
        engines' own prefill cost from when it was sent (a group's servers take turns on its GPUs; a
        handed-over stream's re-prefill and a moved stream's are left out). Unknown cost or prompt: nothing."""
        cost = self._engine_prefill.cost.get(first.speculative) or self._engine_prefill_cost()
        if prompt is None or not cost:
            return
        start = max(self._prefill_ends.get(first.group, 0.0), snapshot.at)
        self._prefill_ends[first.group] = start + prompt.uncached(first.name) * cost

    def may_move(self, decision: Decision) -> bool:
        return self.move_running and (decision.reason == GROUP_SWITCH or decision.decodes_on in self._drained)

    def moves(self, snapshot: PoolSnapshot, decision: Decision, running: Sequence[Running]) -> list[str]:
        """After a decision that switched a co-located group's mode (`adaptive_group_switch`), its requests
        still decoding in the old mode that move to the new one: those whose remaining output, decoded
        that much faster, pays for their re-prefill there (`rules.moves`). A request's output so far is
        its chunks times its backend's tau; what remains, its limit less that (no limit: the mean output);
        its re-prefill, the prompt's part the target does not hold, the output earlier backends gave it and its own.
        After a decision that sends a request to a plain server whose group's streams a drain moved to
        EAGLE (rule 9), every one of them comes back: the group's mode is plain again."""
        if not self.may_move(decision):
            return []
        target = snapshot.get(decision.decodes_on)
        available = [v for v in snapshot.backends if v.available]
        members = [v for v in available if v.group == target.group]
        strays = [r for r in running if r.backend != target.name and any(v.name == r.backend for v in members)]
        if target.name in self._drained and decision.reason != GROUP_SWITCH:
            self._drained.discard(target.name)
            return [r.key for r in strays]
        if len(members) < 2 or not strays:
            return []
        outlooks = {v.name: self._outlook(v) for v in available}
        kinds = self._kinds.of(available, outlooks)  # the pooled lines the decision just used
        if len(kinds) < 2:
            return []
        states = [self._state(v, outlooks[v.name], kinds) for v in members]
        group, load = self._switched
        if group != target.group:  # not this decision's switch (a caller asking out of turn): the load now
            load = float(sum(v.inflight for v in members))
        return stray_moves(states, target.speculative, self._priced(states, strays, target.name),
                           self._prefill.get(target.speculative, 0.0), load)

    def drain_mark(self, at: float) -> DrainMark | None:
        """Rule 9's look `DRAIN_WAIT` of a mean life after a response ends, once a life is known."""
        if not (self.drain and self.move_running) or self._forecast.life <= 0.0:
            return None
        return DrainMark(at, self.lane.clock.decisions(), DRAIN_WAIT * self._forecast.life)

    def drain_moves(self, snapshot: PoolSnapshot, mark: DrainMark, running: Sequence[Running]) -> list[tuple[str, str]]:
        """Rule 9: when no request has been routed since the response of `mark` ended, nor for `DRAIN_QUIET`
        mean gaps between the latest arrivals, each co-located group whose mode is plain moves its plain
        streams to its EAGLE server, all or none (`rules.drain`: a long tail still to come, paid for, held
        by EAGLE's KV room). The pooled lines are those the last decision used (looking changes no belief)."""
        if self.lane.clock.decisions() != mark.decisions or self._forecast.quiet(snapshot.at) < DRAIN_QUIET:
            return []
        available = [v for v in snapshot.backends if v.available]
        tail = DRAIN_TAIL * self._arrival_output
        out: list[tuple[str, str]] = []
        for group in dict.fromkeys(v.group for v in available):
            members = [v for v in available if v.group == group]
            eagle = [v for v in members if v.speculative]
            plain = [v for v in members if not v.speculative]
            if len(members) != 2 or len(eagle) != 1 or self._modes.get(group) is not False:
                continue
            strays = [r for r in running if r.backend == plain[0].name]
            longest = max(((r.max_tokens if r.max_tokens is not None else self._mean_output) - r.chunks for r in strays), default=0.0)
            if longest < tail or len(self._kinds.lines) < 2:  # plain streams: a chunk is a token
                continue
            states = [self._state(v, self._outlook(v), self._kinds.lines) for v in members]
            priced = self._priced(states, strays, eagle[0].name)
            keys = drain(states, priced, self._stall_cost(True), tail, eagle[0].kv_tokens)
            if keys:
                self._drained.add(plain[0].name)
                out.extend((key, eagle[0].name) for key in keys)
        return out

    def _priced(self, states: list[BackendState], strays: Sequence[Running], target: str) -> list[Stray]:
        """`strays` as the move rules price them towards `target`: output to come and tokens to re-prefill."""
        taus = {s.name: s.tau for s in states}
        priced = []
        for r in strays:
            produced = r.chunks * taus[r.backend]
            remaining = (r.max_tokens if r.max_tokens is not None else self._mean_output) - produced
            uncached = max(r.prompt_tokens - r.cached.get(target, 0.0), 0.0)
            priced.append(Stray(r.key, r.backend, max(remaining, 0.0), uncached + r.given + produced))
        return priced

    def paced(self, progress: Progress) -> None:
        """A stretch of a stream is a point of its backend's curve once the backend's tokens per chunk
        are known (its first completion), so the curve follows a load within a few steps of it."""
        arm = self._arms.get(progress.backend)
        if arm is None or (arm.speculative and arm.tau_chunks <= 0.0) or progress.chunks < 1 or progress.seconds <= 0.0:
            return
        others = progress.mean_group_inflight - progress.mean_inflight
        if (arm.shared or self.colocated) and others > SHARED_TOLERANCE:
            return  # the other server's steps were interleaved with these
        tokens = progress.chunks * arm.tau
        seconds = self._decoding(progress.seconds, progress.group_prompt_tokens)
        arm.estimator.observe(progress.mean_inflight, seconds / tokens, max(round(tokens), 1))

    def observe(self, completion: Completion) -> None:
        arm = self._arms.get(completion.backend)
        if arm is None:  # a forced route's response, or another worker's: the arm starts as the pool lists it
            arm = self._arms[completion.backend] = listed_arm(self._new_arm, self._live, completion.backend)
        self._forecast.finished(completion.ttft + completion.decode_seconds)
        if completion.streamed:
            arm.streamed += 1
            self._streamed += 1
        else:
            arm.unstreamed += 1
            self._unstreamed += 1
        arm.learn_tau(completion.decoded, completion.token_chunks)
        self._learn_prompt(arm, completion)
        tokens = completion.decoded - 1  # the first token's time is TTFT, not decode
        if tokens < 1 or completion.decode_seconds <= 0.0:
            return
        others = completion.mean_group_inflight - completion.mean_inflight
        if (arm.shared or self.colocated) and others > SHARED_TOLERANCE:
            # The other server of its group decoded meanwhile and its steps were interleaved with this one's
            # on the shared GPU: this TPOT is not what this server costs on its own.
            arm.shared_skipped += 1
            if arm.probe_pending:
                self._judge_probe(arm, taught_nothing=True)
            return
        n, tpot = completion.mean_inflight, self._decoding(completion.decode_seconds, completion.group_prompt_tokens) / tokens
        if arm.probe_pending:
            self._judge_probe(arm, taught_nothing=abs(tpot / arm.estimator.predict(n) - 1.0) <= PROBE_AGREEMENT)
        relearns = arm.estimator.relearns
        arm.estimator.observe(n, tpot, tokens)
        if arm.estimator.relearns > relearns:  # this backend changed: the comparison is open again
            for each in self._arms.values():
                each.probe_interval = self.probe_every

    def _decoding(self, seconds: float, prompt_tokens: float) -> float:
        """Of a decode window's `seconds`, those its group spent decoding: less the prefill of the `prompt_tokens`
        sent to the group meanwhile, at the engines' own prefill cost (none where they report none). Both
        modes pay a prefill alike, and the mode that decodes faster has more arrivals per request in flight:
        counted in, it made a measured curve rise with the traffic's arrival rate, not its batch."""
        cost = self._engine_prefill_cost()
        if prompt_tokens <= 0.0 or cost <= 0.0:
            return seconds
        return max(seconds - prompt_tokens * cost, DECODE_FLOOR * seconds)

    def _engine_prefill_cost(self) -> float:
        """Seconds of prefill per uncached prompt token, as the engines count it (their kinds' mean; 0: not reported)."""
        costs = self._engine_prefill.cost
        return sum(costs.values()) / len(costs) if costs else 0.0

    def _learn_steps(self, arm: Arm, reading: StepReading | None) -> None:
        """A backend whose responses are never streamed learns its curve and tau from its engine's decode
        steps (co-located: only over stretches where the other server of its group ran none)."""
        if reading is None or not arm.engine_taught:
            return
        if (arm.shared or self.colocated) and not reading.alone:
            arm.shared_skipped += 1
            return
        arm.learn_tau(reading.tokens, reading.request_steps)
        arm.estimator.observe(reading.batch, reading.tpot, reading.tokens)

    def predicted_tpot(self, snapshot: PoolSnapshot, backend: str) -> float | None:
        """Its fitted TPOT for one more request on `backend`'s group at `snapshot`'s load (as `beliefs`)."""
        arm = self._arms.get(backend)
        if arm is None or not arm.estimator.fitted:
            return None
        return arm.estimator.predict(snapshot.group_inflight(snapshot.get(backend)) + 1) * self._spec_factor(arm)

    def _learn_prompt(self, arm: Arm, completion: Completion) -> None:
        """The mean output, and per kind the time to first token per prompt token it had to prefill, from
        responses with a long uncached prompt (their TTFT is mostly prefill, queueing for it included)."""
        self._mean_output += OUTPUT_RATE * (completion.output_tokens - self._mean_output)
        if completion.given > 0:  # handed over: where its prompt was prefilled, and how much, is not reported
            return
        if completion.prompt_tokens > 0:
            share = min(completion.cached_tokens / completion.prompt_tokens, 1.0)
            self._hit_share += OUTPUT_RATE * (share - self._hit_share)
            self._hits_read += 1
        uncached = completion.prompt_tokens - completion.cached_tokens
        # Uncached: a prefix other requests share is held once (an own earlier turn's is not, and is
        # missed: the room is then overestimated, which errs towards pricing no wait at all).
        footprint = float(max(uncached, 0) + completion.output_tokens)
        known_footprint = self._footprint
        self._footprint = footprint if known_footprint is None else known_footprint + OUTPUT_RATE * (footprint - known_footprint)
        if uncached >= PREFILL_MIN_TOKENS and completion.first_token_seen and completion.ttft > 0.0 and arm.speculative is not None:
            per_token = completion.ttft / uncached
            known = self._prefill.get(arm.speculative)
            self._prefill[arm.speculative] = per_token if known is None else known + OUTPUT_RATE * (per_token - known)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "eagle_cap": self.cap,
            "slo_tpot_seconds": self.slo_tpot,
            "probe_every": self.probe_every,
            "colocated": self.colocated,
            "move_running": self.move_running,
            "handover": self.handover,
            "drain": self.drain,
            "half_life": self.estimator.half_life,
            "beliefs": self.beliefs(),
        }

    def tiers(self) -> dict[str, Any]:
        return self.lane.describe()

    def beliefs(self) -> dict[str, Any]:
        """Fitted lines, predicted TPOT for one more request at the current load, the prompt costs the prefix
        rule prices (prefill per token by kind, the share of prompts found cached and the reuse it
        implies), the mean output, per-group beliefs (the prefill a request sent there now would wait
        behind among them), the crossover."""
        snapshot = self._live() if self._live is not None else None
        views = {b.name: b for b in snapshot.backends} if snapshot else {}
        predicted = {}
        for name, arm in self._arms.items():
            if arm.estimator.fitted:
                view = views.get(name)
                n = snapshot.group_inflight(view) if snapshot is not None and view is not None else 0
                predicted[name] = arm.estimator.predict(n + 1) * self._spec_factor(arm)
        beliefs: dict[str, Any] = {
            "predicted_tpot_seconds": predicted,
            "backends": {name: arm.describe() for name, arm in self._arms.items()},
            "prefill_seconds_per_token": {("eagle" if kind else "plain"): cost for kind, cost in self._prefill_costs().items()},
            "engine_prefill_seconds_per_token": {("eagle" if kind else "plain"): cost for kind, cost in self._engine_prefill.cost.items()},
            "prefilling_per_request": self._prefilling(),
            "prefix_hit_share": self._hit_share,
            "mean_output_tokens": self._mean_output,
            "prefix_reuse": self._reuse(),
        }
        if snapshot is not None:
            outlooks = {v.name: self._outlook(v) for v in snapshot.backends}
            kinds = self._kinds.of(list(snapshot.backends), outlooks)
            states = [self._state(v, outlooks[v.name], kinds) for v in snapshot.backends]
            known = self._groups(snapshot)
            beliefs["groups"] = group_beliefs(snapshot, states, {group: state.load for group, state in known.items()})
            for group, entry in beliefs["groups"].items():
                entry["last_decision"] = self._last.get(group)
                entry["prefill_queued_seconds"] = known[group].queued if group in known else 0.0
        cross = self.crossover()
        if cross is not None:
            beliefs["crossover_concurrency"] = cross
        return beliefs

    def crossover(self) -> float | None:
        """The batch size from which a plain server decodes faster than the EAGLE one, per the fits.

        Where the first EAGLE and the first plain backend's fitted lines cross (calibration.md's
        crossover); 0 when plain is faster at every load, infinity when EAGLE is, None until both are fitted.
        """
        return crossover(self._arms.values())

    def _new_arm(self, speculative: bool | None) -> Arm:
        # Plain decode's cost grows least with the batch (what a plain server is for), so its line starts
        # nearly flat, and stays no steeper than that far past the loads it ran at (a plain curve priced too
        # dear there is never sent the load that would correct it); EAGLE's verification grows with every
        # request, so its starts steeper.
        config = replace(self.estimator, prior_slope_ratio=PLAIN_PRIOR_SLOPE, far_prior=True) if speculative is False else self.estimator
        return Arm(TpotEstimator(config), probe_interval=self.probe_every, speculative=speculative)

    def _comes_back(self, arm: Arm, view: BackendView) -> bool:
        """Available again after the last routed snapshot showed it unavailable, with a fit to revise."""
        return view.available and not arm.was_available and arm.estimator.fitted

    def _outlook(self, view: BackendView) -> Outlook:
        arm = self._arms.get(view.name)
        if arm is None:
            return Outlook(None, 0, self.probe_every, 0.0, 1.0)
        if self._comes_back(arm, view):  # what `_sync` will do, without doing it
            keep = self.estimator.relearn_keep
            return Outlook(arm.estimator, self.probe_every, self.probe_every, arm.estimator.evidence * keep, arm.tau)
        return Outlook(arm.estimator, arm.since_routed, arm.probe_interval, arm.estimator.evidence, arm.tau)

    def _sync(self, view: BackendView) -> Arm:
        arm = self._arms.get(view.name)
        if arm is None:
            arm = self._arms[view.name] = self._new_arm(view.speculative)
        arm.speculative, arm.group = view.speculative, view.group
        if self._comes_back(arm, view):
            # Back after an outage (a restart, maybe with other settings): re-learn fast from
            # the old fit, and measure it at the next idle moment.
            arm.estimator.forget(self.estimator.relearn_keep)
            arm.probe_interval = arm.since_routed = self.probe_every
        arm.was_available = view.available
        return arm

    def _open(self, view: BackendView) -> bool:
        return not view.speculative or view.inflight < self.cap

    def _probe(
        self,
        snapshot: PoolSnapshot,
        available: list[BackendView],
        outlooks: dict[str, Outlook],
        kinds: dict[bool, KindLine],
    ) -> Decision | None:
        """A probe of a kind (plain first, as ever) that no backend of it has served for its probe
        interval and that the fits leave in the running, or that was never measured alone
        (`LONE_LOAD`): the kind shares one line, so one probe measures it, on a fitted backend of an
        idle group where there is one (its response judges the probe)."""
        shared = self.colocated or len({v.group for v in snapshot.backends}) < len(snapshot.backends)
        for kind in (False, True):
            members = sorted((v for v in available if v.speculative == kind), key=lambda v: (not outlooks[v.name].fitted, v.name))
            outs = [outlooks[v.name] for v in members]
            if not any(o.fitted for o in outs):
                continue
            never_alone = kind in kinds and kinds[kind].line.floor > LONE_LOAD
            wait = self.probe_every if never_alone else 0  # a never-measured kind waits only for its backoff
            if any(o.since_routed < o.probe_interval - wait for o in outs):
                continue
            if not never_alone and len(kinds) == 2 and not in_the_running(self._kind_line(kind, kinds), self._kind_line(not kind, kinds), self.cap, shared):
                continue
            for view in members:
                if self._probeable(snapshot, view):
                    return Decision(view.name, "adaptive_explore")
        return None

    def _kind_line(self, kind: bool, kinds: dict[bool, KindLine]) -> Curve:
        """The kind's pooled line as the rules see it (EAGLE's scaled by the speculation prior), made once
        per recomputation of the pooled lines."""
        generation, scaled = self._scaled
        if generation != self._kinds.generation:
            scaled = {k: pooled.line.scaled(self._factor(k, pooled.evidence)) for k, pooled in kinds.items()}
            self._scaled = (self._kinds.generation, scaled)
        return scaled[kind]

    def _probeable(self, snapshot: PoolSnapshot, view: BackendView) -> bool:
        """A probe must measure the backend on its own: its group idle (a co-located partner's steps
        would be interleaved with the probe's) and not in a busy spell, and EAGLE within its cap."""
        shared = sum(v.group == view.group for v in snapshot.backends) > 1
        quiet = not shared or max(self._group_loads(snapshot)[:2]) < PROBE_MAX_LOAD
        return self._open(view) and snapshot.group_inflight(view) == 0 and quiet

    def _cold(
        self,
        snapshot: PoolSnapshot,
        available: list[BackendView],
        outlooks: dict[str, Outlook],
        kinds: dict[bool, KindLine],
    ) -> Decision | None:
        """Before every backend is fitted: measure an unfitted kind on an idle group, one request of it
        at a time (a kind's first response fits the line its backends share), and a request alone on
        its group speculates. None when each kind has a fitted backend whose line the unfitted ones
        of its kind borrow (K groups: one busy group's unmeasured server must not hold every group back)."""
        if all(v.speculative in kinds for v in available):
            return None  # each kind has a fitted line, which its unfitted backends share
        idle = all(v.inflight == 0 for v in available)
        spec_fitted = any(v.speculative and outlooks[v.name].fitted for v in available)
        plain_measuring = any(not v.speculative and v.inflight > 0 for v in available)
        by_name = sorted(available, key=lambda v: v.name)
        for view in by_name:
            if not view.speculative and not outlooks[view.name].fitted and self._probeable(snapshot, view):
                if (spec_fitted or not idle) and not plain_measuring:
                    return Decision(view.name, "adaptive_explore")
        if idle:
            spec = [v for v in by_name if v.speculative and self._open(v)]
            if spec:
                return Decision(spec[0].name, "adaptive_prior")
        for view in by_name:
            if view.speculative and not outlooks[view.name].fitted and self._probeable(snapshot, view):
                return Decision(view.name, "adaptive_explore")
        alone = [v for v in by_name if v.speculative and self._open(v) and snapshot.group_inflight(v) == 0]
        if alone:
            return Decision(alone[0].name, "adaptive_prior")
        plain = [v for v in available if not v.speculative] or [v for v in available if self._open(v)] or available
        least = min(plain, key=lambda v: (snapshot.group_inflight(v), v.inflight, v.name))
        return Decision(least.name, "adaptive_prior")

    def _state(self, view: BackendView, outlook: Outlook, kinds: dict[bool, KindLine], *, full: bool = False) -> BackendState:
        """The backend as the group rule sees it: its kind's pooled line (EAGLE's scaled by the
        speculation prior, each raised by the join wait: `_join_wait`), tau, the share of expected output
        its in-flight requests still have to produce, and (`full`) whether this request would wait there
        for KV room.

        Backends of one kind share one line: the launcher makes every group alike, and per-backend
        fits of identical servers drift apart by noise, which made the group rule pile requests on
        the group whose fit happened to look fastest (docs/adaptive.md#the-decision). With one line
        per kind, identical groups fill least-loaded first.
        """
        line = self._kind_line(view.speculative, kinds) if view.speculative in kinds else None
        tau = outlook.tau if view.speculative else 1.0
        wait = self._join_wait(tau)
        if line is not None and wait > 0.0:
            line = line.scaled(1.0 + wait)
        produced = view.relayed_chunks * tau
        remaining = max(0.0, 1.0 - produced / view.expected_tokens) if view.expected_tokens > 0 else 0.0
        return BackendState(
            view.name,
            view.group,
            view.speculative,
            view.available,
            view.inflight,
            cap=self.cap if view.speculative else None,
            line=line,
            tau=tau,
            remaining=remaining,
            room=max(view.kv_tokens / self._footprint, 1.0) if view.kv_tokens and self._footprint else None,
            full=full,
            takeover=self._takeover(view, remaining) if self.move_running else None,
        )

    def _join_wait(self, tau: float) -> float:
        """The share a request's decode time grows by for the step in progress it waits out once when it
        joins, spread over its output: a step over the mean output, where a step yields `tau` tokens (a
        speculative step is the longer by `tau`). 0 where a prefix is reused at least `RATE_REUSE` times
        (docs/adaptive.md, rule 1 in full) or before `REUSE_KNOWN` responses have told the reuse."""
        if self._hits_read < REUSE_KNOWN or self._reuse() >= RATE_REUSE:
            return 0.0
        return tau / max(self._mean_output, 1.0)

    def _drain_time(self, view: BackendView, outlook: Outlook, kinds: dict[bool, KindLine]) -> float:
        """Seconds until `view`'s in-flight requests have all ended: their mean output left (a mean response's
        where their expected output is not known; a token at least), spread over `DRAIN_SPREAD` times that,
        at its kind's TPOT at its load; inf before its kind has a line."""
        if view.inflight == 0:
            return 0.0
        if view.speculative not in kinds:
            return math.inf
        tau = outlook.tau if view.speculative else 1.0
        left = max((view.expected_tokens - view.relayed_chunks * tau) / view.inflight, 1.0) if view.expected_tokens > 0 else self._mean_output
        return DRAIN_SPREAD * left * self._kind_line(view.speculative, kinds).at(view.inflight)

    def _stall_cost(self, kind: bool) -> float:
        """Seconds a prompt token re-prefilled on a `kind` server stalls its batch: as its engines count their
        prefill (else their kinds' mean), else as times to first token taught it (its queueing included,
        which stalls no one); 0: not known."""
        return self._engine_prefill.cost.get(kind) or self._engine_prefill_cost() or self._prefill.get(kind, 0.0)

    def _takeover(self, view: BackendView, remaining: float) -> float | None:
        """`BackendState.takeover`: the prompt tokens its requests were sent to prefill and their output so far,
        at the other kind's prefill cost as the engines count it (else their kinds' mean, else as its times to
        first token taught it), over a mean response; None while none is known."""
        kind = not view.speculative
        cost = self._stall_cost(kind)
        if not cost:
            return None
        per_request = (self._sent.mean or 0.0) + (1.0 - remaining) * self._mean_output
        return view.inflight * per_request * cost / self._mean_output

    def _prompt_cost(self, available: list[BackendView], prompt: Prompt | None) -> PromptCost | None:
        """The request's prefill on each backend, at one cost for every backend (the dearest kind's learned
        one), and its expected output; None without a prompt, before any prefill cost was learned, or when
        no backend holds any of it (every option then prefills it all: the load alone decides).

        One cost: the kinds' learned costs differ not by their prefill but by what else their first tokens
        waited for (EAGLE's longer steps, its queue for a co-located server's smaller KV share), which is
        no reason to prefer a kind (the decode curves choose the mode); the dearest keeps a held prefix
        worth what the slowest first tokens showed."""
        costs = self._prefill_costs()
        if prompt is None or not prompt.cached or not costs:
            return None
        cost = max(costs.values())
        prefill = {v.name: prompt.uncached(v.name) * cost for v in available}
        output = float(prompt.max_tokens) if prompt.max_tokens is not None else self._mean_output
        return PromptCost(prefill, max(output, 1.0), self._reuse(), self._persistence(prompt))

    def _prefill_costs(self) -> dict[bool, float]:
        """Per kind, the seconds a prompt token to prefill costs: as long-prompt responses' times to first
        token taught it (what a prefill delays, its queueing included); where responses come and none is
        streamed, as the engines count it. Streamed short prompts teach none, and their prefixes stay
        unpriced: a short prompt's prefill is mostly the step it joins."""
        if self._prefill or self._streamed or not self._unstreamed:
            return self._prefill
        return self._engine_prefill.cost

    def _persistence(self, prompt: Prompt) -> float:
        """The share of each group's load now that the later requests building on this prompt's prefix will
        still meet: its requests end within a life, so none of it for a prefix sent a life or more ago (a
        conversation's next turn), all of it for one sent moments ago (a shared prompt whose users keep
        coming, whose load they are); all of it while the life or the interval is unknown."""
        life = self._forecast.life
        if prompt.since_sent is None or life <= 0.0:
            return 1.0
        return min(max(1.0 - prompt.since_sent / life, 0.0), 1.0)

    def _reuse(self) -> float:
        """Later requests expected to build on one request's prefix: with a share h of every prompt found
        cached, a prefix is reused h / (1 - h) times on average (up to `REUSE_HORIZON`)."""
        held = self._hit_share
        return REUSE_HORIZON if held >= REUSE_HORIZON / (1.0 + REUSE_HORIZON) else held / (1.0 - held)

    def _group_loads(self, snapshot: PoolSnapshot) -> tuple[float, float, float]:
        """The load each group is expected to carry over the next request life, the load each has
        been carrying over the last few, and the requests expected to arrive at each over the next life:
        the node's forecast, settled load and arrivals over its groups (read once per snapshot). A
        request finding the node idle under light traffic expects no more than itself and those joining
        it over its life (`LoadForecast.joining`), over the groups, for both: the mean load its
        predecessors met says more of their bursts than of the life it is starting."""
        read_on, loads = self._loads
        if read_on is not snapshot:
            groups = len({v.group for v in snapshot.backends if v.available}) or 1
            reading = (snapshot.at, snapshot.total_inflight)
            loads = (self._forecast.load(*reading) / groups, self._forecast.settled(*reading) / groups, self._forecast.arriving(*reading) / groups)
            if snapshot.total_inflight == 0 and (joining := self._forecast.joining()) is not None:
                lone = 1.0 + joining / groups
                loads = (min(loads[0], lone), min(loads[1], lone), loads[2])
            self._loads = (snapshot, loads)
        return loads

    def _groups(self, snapshot: PoolSnapshot) -> dict[str, GroupState]:
        load, settled, arriving = self._group_loads(snapshot)
        prefilling = self._prefilling()
        burst = self._forecast.in_burst(snapshot.at)
        ends = self._prefill_ends
        rate = self._forecast.light_rate() if self._reuse() >= RATE_REUSE else None
        groups = len({v.group for v in snapshot.backends if v.available}) or 1
        offered = None if rate is None else rate / groups * self._mean_output
        return {v.group: GroupState(load, self._modes.get(v.group), settled, arriving, prefilling, burst,
                                    max(ends.get(v.group, 0.0) - snapshot.at, 0.0), offered)
                for v in snapshot.backends}

    def _prefilling(self) -> float:
        """The share of a group's time that each request in flight there brings prefill to it: as many arrive
        over a life as are in flight, each sent the mean prompt tokens to prefill, at the engines' cost."""
        cost, life, sent = self._engine_prefill_cost(), self._forecast.life, self._sent.mean
        return sent * cost / life if sent is not None and cost > 0.0 and life > 0.0 else 0.0

    def _capped_was_faster(self, states: list[BackendState], chosen: str) -> bool:
        """Whether a backend at its cap would have served this request faster than the one chosen."""
        loads: dict[str, int] = {}
        for s in states:
            loads[s.group] = loads.get(s.group, 0) + s.inflight
        predicted = {s.name: s.line.at(loads[s.group] + 1) for s in states if s.line is not None}
        return any(not s.open and not s.full and predicted[s.name] < predicted[chosen] for s in states)

    def _judge_probe(self, arm: Arm, *, taught_nothing: bool) -> None:
        """Back the backend's probe interval off after a probe that taught nothing, else reset it."""
        arm.probe_pending = False
        if taught_nothing:
            arm.probe_interval = min(2 * arm.probe_interval, PROBE_BACKOFF_LIMIT * self.probe_every)
        else:
            arm.probe_interval = self.probe_every

    def _factor(self, speculative: bool, evidence: float) -> float:
        """The speculation prior: EAGLE's prediction scaled down, fading as its evidence grows."""
        return 1.0 - SPEC_PRIOR * SPEC_PRIOR_WEIGHT / (SPEC_PRIOR_WEIGHT + evidence) if speculative else 1.0

    def _spec_factor(self, arm: Arm) -> float:
        return self._factor(bool(arm.speculative), arm.estimator.evidence)


def _waiting_for_room(available: list[BackendView], prompt: Prompt | None, mean_output: float, drain: Callable[[BackendView], float]) -> set[str]:
    """The backends where the request would wait for KV room, as SGLang admits it (its uncached prompt and
    output beside what the in-flight requests hold: their prompts to prefill and expected outputs), where
    a server of the same kind in another group would make it wait less than `ROOM_WAIT_SHARE` as long (or
    not at all). Only that wait is avoided: a server of the other kind, or its own group's other one, would
    mix modes on shared GPUs for the request's whole life, against a wait that usually ends with the next
    response.

    A wait is the share of the server's footprint that must end before the request fits, of `drain(v)`:
    the seconds until its in-flight requests have all ended (inf: not known)."""
    if prompt is None:
        return set()
    output = prompt.max_tokens if prompt.max_tokens is not None else mean_output

    def wait(v: BackendView) -> float:
        held = v.held_prompt_tokens + v.expected_tokens
        short = held + prompt.uncached(v.name) + output - v.kv_tokens
        if not v.kv_tokens or short <= 0:
            return 0.0
        return min(short / held, 1.0) * drain(v) if held > 0 else math.inf

    waits = {v.name: wait(v) for v in available}
    return {
        v.name
        for v in available
        if waits[v.name] > 0 and any(r.speculative == v.speculative and r.group != v.group and waits[r.name] < ROOM_WAIT_SHARE * waits[v.name] for r in available)
    }


def _holding(available: list[BackendView], prompt: Prompt | None) -> list[BackendView]:
    """The backends whose KV cache can hold the request (its prompt and the output it asks for at most),
    as SGLang admits it: those that hold the most tokens its prompt is likely to be (a server that cannot
    hold it answers 400, where one passed over only decodes elsewhere), else those that hold the
    estimate; every one of `available` while no backend's capacity is known to be short (or when none
    holds it: the backend's own error then says why)."""
    if prompt is None:
        return available
    for tokens in dict.fromkeys((prompt.most_tokens or prompt.tokens, prompt.tokens)):
        need = tokens + (prompt.max_tokens or 0)
        holding = [v for v in available if not v.kv_rank_tokens or need <= v.kv_rank_tokens]
        if holding:
            return holding
    return available
