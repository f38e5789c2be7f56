"""Which (GPU group, mode) a request goes to: the adaptive rule for K groups, and the tier rules, as pure functions.

A group is GPUs running one EAGLE-3 and one plain server co-located (their steps take turns) or one server
alone (partitioned). Per backend: its TPOT curve (decode alone), in-flight count, tau and the share of its
in-flight output to come; per group its loads, its mode, prefill share and queued prefill. `choose`, reasons
in brackets: (1) a co-located group runs the mode serving `L = max(n_group + 1, expected)` fastest
[`adaptive_predicted_faster`] (under light traffic with reused prefixes, `GroupState.offered`: the one whose
lives are shortest at its arrival rate, `rate_tpot`); (2) it changes mode only when the gain over a few lives
pays for the requests a switch strands (their drain, or their re-prefill where they follow it and the gain
holds at its settled load too) [`adaptive_group_switch`, else `adaptive_group_stay`], and turns to
speculation only for a gain at its settled load too, within the load EAGLE was measured at; (3) the request
goes to the group where it would decode fastest, priced at the round it joins, slowed by its requests'
prefill (alike for both modes), its first token after the prefill queued there [`adaptive_prefill_wait`];
(4) a capped backend gets nothing [`adaptive_cap`], nor a `full` one [`adaptive_kv_room`]; prices count the
wait for KV room. More: docs/adaptive.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.policies.adaptive.fit import Curve
from gateway.policies.lane import TierSettings
from gateway.pool.snapshot import PoolSnapshot

# A group changes mode only for a mode faster by more than this share (within it, either serves its load)...
SWITCH_MARGIN = 0.03
# ... and when staying would lose, over this many request lives, more than the switch strands.
SWITCH_HORIZON = 4.0
# A group leaves plain decode for speculation only at loads within this factor of the largest EAGLE was
# measured at: EAGLE's cost grows fastest with the batch, and measurements at light load miss what
# heavy load adds (more prefill between steps), so its extrapolation flatters it where plain is measured.
EAGLE_REACH = 1.25

# The reason of a decision that turned a co-located group to the other mode (its strays may follow: `moves`).
GROUP_SWITCH = "adaptive_group_switch"
# The reason of one that passed over a server whose KV cache would have made it wait (`BackendState.full`).
KV_ROOM = "adaptive_kv_room"
# The reason of one that passed over the group the load chose for the prefill queued there (`GroupState.queued`).
PREFILL_WAIT = "adaptive_prefill_wait"
# A group whose arrivals stopped moves its plain streams to speculation (`drain`) once no request has come
# for this many mean gaps between the latest arrivals, ...
DRAIN_QUIET = 4.0
# ... when the longest has this many mean responses' output still to come (a long tail, not a lull's
# ordinary answer), and their decode saved pays this many times the stall of their re-prefill (there
# and, should requests come again, back).
DRAIN_TAIL = 2.0
DRAIN_PRICE = 2.0
# A request going to an EAGLE server is answered its first token by the plain server of its group when
# that one would prefill at most this share of what the EAGLE server would (it holds more of the prefix).
HANDOVER_PREFILL_SHARE = 1.0 / 3.0
# A group's engines are taken to decode at least this share of the time, whatever prefill it is sent.
MAX_PREFILLING = 0.75
# The birth-death chain of `rate_tpot` is summed until a state weighs this share of the total, over at most
# this many requests in flight (beyond: the rate is more than the server carries).
RATE_TAIL = 1e-9
RATE_LIMIT = 4096


@dataclass(frozen=True)
class BackendState:
    """One backend as the rule sees it."""

    name: str
    group: str  # backends of one group share GPUs; a backend alone in its group is partitioned
    speculative: bool
    available: bool
    inflight: int
    cap: int | None = None  # most requests it may have at once; None: no cap
    line: Curve | None = None  # fitted TPOT curve; None until fitted
    tau: float = 1.0  # output tokens per decode step per request (EAGLE: the observed acceptance length)
    # Share of their expected output its in-flight requests have still to produce. Unknown: 0, so
    # a group switches at once (a 1 would keep it in its mode for as long as requests keep coming).
    remaining: float = 0.0
    # Requests of the usual size its KV cache holds at once (None: not known, no limit). Beyond it SGLang
    # queues the rest, so a load of n runs `room` at a time and every request's life stretches by n / room.
    room: float | None = None
    # Its KV cache cannot take this request beside its in-flight ones (SGLang would queue it until they end)
    # while a server of its kind in another group can, or would after a much shorter wait: the mean-size
    # `room` does not see a long prompt's wait.
    full: bool = False
    # GPU seconds, per token of a request life, its group's other server would spend re-prefilling its
    # in-flight requests (their prompts and output so far) to take them over when the group switches away
    # from it (None: not known).
    takeover: float | None = None

    @property
    def open(self) -> bool:
        """Whether it can take one more request."""
        return self.available and not self.full and (self.cap is None or self.inflight < self.cap)


@dataclass(frozen=True)
class GroupState:
    """A group as the policy knows it beyond its backends: the load it is expected to carry over the next
    request life, and the mode its new requests have been going to (None: none yet)."""

    load: float = 0.0
    mode: bool | None = None  # speculative?
    settled: float = 0.0  # its mean load over the last few lives: speculation resumes only when that is light too
    arriving: float = math.inf  # requests expected to arrive at it over the next request life (inf: not known)
    # The share of its time each request in flight brings its engines' prefill to (the arrivals it stands
    # for): its requests decode that much slower than its servers' curves, which are of decode alone.
    prefilling: float = 0.0
    # The request comes in one burst with the one before it: how many more come in it is not known, so the
    # load it settled at before says nothing of whether the load now passes.
    burst: bool = False
    # Seconds of prefill already sent to its GPUs that a request sent now would wait behind for its first
    # token (its servers' prefills take turns on them).
    queued: float = 0.0
    # Under light traffic (most arrivals find the node idle): the output tokens a second it is sent (its
    # arrivals a second times the mean output). A co-located group then runs the mode that carries that
    # rate fastest over the loads random arrivals bring (`rate_tpot`), not the one faster at the count
    # of the moment: a lone request's mode would otherwise flip at each second arrival. None: not light.
    offered: float | None = None


@dataclass(frozen=True)
class _Option:
    backend: BackendState
    reason: str
    predicted: float  # seconds per token this request is predicted to decode at
    load: int  # the group's in-flight count
    harm: float = 0.0  # seconds its decode adds to other requests' latency, per token of its output


@dataclass(frozen=True)
class PromptCost:
    """What a request's prompt costs where it goes: seconds of prefill per backend (the prompt tokens
    that backend would have to prefill, at the learned prefill cost), and the output it is
    expected to decode, in tokens, against which a faster decode weighs."""

    prefill: Mapping[str, float]
    output_tokens: float
    # Later requests expected to build on this one's prefix where it goes (a conversation's next turns,
    # a shared prompt's next users): each decodes where this one is cached, so a decode faster by a
    # little pays back a prefill once, over them all.
    reuse: float = 0.0
    # The share of a group's load now that those later requests will still meet (1: all of it). The rest of
    # a difference between groups offering the same kind of placement has passed by then.
    persistence: float = 1.0


def choose(
    backends: Sequence[BackendState],
    groups: Mapping[str, GroupState] | None = None,
    prompt: PromptCost | None = None,
    *,
    strays_follow: bool = True,
) -> tuple[str, str]:
    """The backend for one request and the reason label; see the module docstring for the rule.

    `groups` holds each group's expected load and mode; a group missing from it has neither yet.
    `strays_follow`: a group's switch moves its old mode's streams to the new one (`moves`), so a switch
    is priced as the new mode carrying the group's load; without, they stay there until they end.
    With `prompt`, each option is priced at its prefill (the prefill queued on its group, then its own)
    plus its decode of the expected output, for this request and the later ones building on it (those at
    the mean price of that kind of placement over the groups, moved towards its own by the share of its
    load that lasts until they come), and the
    other server of a group that holds the prompt's prefix is an option too (`adaptive_prefix_beside`:
    it does not change the group's mode); a group's own choice that differs from the load-only one is
    labelled `adaptive_prefill_wait` where less prefill is queued there and no more of the prompt is to
    prefill, else `adaptive_prefix`.
    """
    available = [b for b in backends if b.available]
    if not available:
        raise ValueError("no backend is available")
    known = groups or {}
    if len(available) == 1:
        return available[0].name, "adaptive_unavailable"
    if any(b.line is None for b in available):
        return _cold(available)
    by_group: dict[str, list[BackendState]] = {}
    for b in available:
        by_group.setdefault(b.group, []).append(b)
    present = (1.0 + sum(b.inflight * _left(b) for b in available)) / len(by_group)
    options = [_slowed(opt, known) for name, members in by_group.items() if (opt := _group_option(members, known.get(name, GroupState()), present, strays_follow))]
    if not options:  # every backend is at its cap: the least loaded takes the overflow
        least = min(available, key=lambda b: (b.inflight, b.name))
        return least.name, "adaptive_cap"
    best = min(options, key=lambda o: (o.predicted, o.load, o.backend.name))
    waits = {group: known[group].queued if group in known else 0.0 for group in by_group}
    if prompt is None or (
        all(prompt.prefill.get(b.name, 0.0) >= prompt.prefill.get(best.backend.name, 0.0) for b in available)
        and all(waits[o.backend.group] >= waits[best.backend.group] for o in options)
    ):
        return best.backend.name, best.reason  # nowhere holds more of the prompt or waits less than the load's choice
    # The prefix lives somewhere: the other server of its group is a candidate as well (priced beside
    # the group's requests, it rarely pays for more than a long prompt with a short answer).
    holders = [b for b in available if b.open and b not in (o.backend for o in options) and prompt.prefill.get(b.name, 0.0) < max(prompt.prefill.values(), default=0.0)]
    # Against a server beside its group's mode, the mode's own server is priced with the other's steps
    # only while its requests last: they are beside requests or a switch's strays, and end; priced as
    # lasting, they made the mode's server look slow and drew the next request beside them too.
    own = [_slowed(replace(o, predicted=_joined_tpot(o.backend, by_group[o.backend.group], drain=True)), known) if len(by_group[o.backend.group]) > 1 else o for o in options]
    candidates = own + [_slowed(_beside(b, by_group[b.group]), known) for b in holders]
    usual = _usual_prices(candidates)

    def cost(o: _Option) -> tuple[float, int, str]:
        # A prefill stalls the group's running requests as long as it delays this one's first token; the
        # prefill queued ahead of it delays this one alone.
        prefill = waits[o.backend.group] + prompt.prefill.get(o.backend.name, 0.0) * (1.0 + o.load)
        price = o.predicted + o.harm
        later = usual[_kind(o)] + prompt.persistence * (price - usual[_kind(o)])
        return prefill + (price + prompt.reuse * later) * prompt.output_tokens, o.load, o.backend.name

    cheapest = min(candidates, key=cost)
    if cheapest.backend is best.backend or cheapest.reason == "adaptive_prefix_beside":
        return cheapest.backend.name, cheapest.reason
    waited = waits[cheapest.backend.group] < waits[best.backend.group]
    if waited and prompt.prefill.get(cheapest.backend.name, 0.0) >= prompt.prefill.get(best.backend.name, 0.0):
        return cheapest.backend.name, PREFILL_WAIT
    return cheapest.backend.name, "adaptive_prefix"


def _slowed(o: _Option, groups: Mapping[str, GroupState]) -> _Option:
    """`o` priced with its group's prefill between its decode steps (`GroupState.prefilling`): the same for
    either mode of a group, so it weighs only where the request goes among groups."""
    share = min(groups[o.backend.group].prefilling * (o.load + 1.0), MAX_PREFILLING) if o.backend.group in groups else 0.0
    if share <= 0.0:
        return o
    return replace(o, predicted=o.predicted / (1.0 - share), harm=o.harm / (1.0 - share))


def _kind(o: _Option) -> tuple[bool, bool]:
    """What a placement is, whichever group offers it: its mode, and whether beside its group's mode."""
    return o.backend.speculative, o.reason == "adaptive_prefix_beside"


def _usual_prices(candidates: list[_Option]) -> dict[tuple[bool, bool], float]:
    """Per kind of placement, its mean price (seconds per token, harm included) over the groups offering it:
    what it costs once the groups' loads now have passed."""
    prices: dict[tuple[bool, bool], list[float]] = {}
    for o in candidates:
        prices.setdefault(_kind(o), []).append(o.predicted + o.harm)
    return {kind: sum(each) / len(each) for kind, each in prices.items()}


def _beside(b: BackendState, members: list[BackendState]) -> _Option:
    """`b` as an option beside its group's other server: its own TPOT there, and what its steps add to
    the rounds of every request of the other server while it decodes (per token of its output)."""
    others = sum(m.inflight for m in members if m is not b)
    harm = others * _step(b, b.inflight + 1) / b.tau
    return _Option(b, "adaptive_prefix_beside", _joined_tpot(b, members), others + b.inflight, harm)


def _cold(available: list[BackendState]) -> tuple[str, str]:
    """Before every line is fitted: a lone request speculates, anything else decodes plain (least-loaded group)."""
    load: dict[str, int] = {}
    for b in available:
        load[b.group] = load.get(b.group, 0) + b.inflight
    open_ = [b for b in available if b.open] or available
    idle = min(load[b.group] for b in open_)
    in_group = [b for b in open_ if load[b.group] == idle]
    preferred = [b for b in in_group if b.speculative == (idle == 0)] or in_group
    return min(preferred, key=lambda b: b.name).name, "adaptive_prior"


def _running(b: BackendState, n: float) -> float:
    """How many of `n` requests on `b` decode at once: all of them, or as many as its KV cache holds."""
    return min(n, b.room) if b.room is not None else n


def _stretch(b: BackendState, n: float) -> float:
    """How much longer each of `n` requests on `b` takes for the ones its KV cache makes wait: n / room."""
    return n / b.room if b.room is not None and n > b.room else 1.0


def _tpot(b: BackendState, n: float) -> float:
    """Predicted TPOT with `n` requests on `b`, the wait for KV room included."""
    assert b.line is not None
    return b.line.at(_running(b, n)) * _stretch(b, n)


def _step(b: BackendState, n: float) -> float:
    """Predicted step time with n requests on `b`: its tokens per step times its TPOT for those running."""
    assert b.line is not None
    return b.tau * b.line.at(_running(b, n)) if n > 0 else 0.0


def _stay_loss(old: BackendState, new: BackendState, load: float) -> float:
    """GPU time lost, per token of a request life, by keeping the group's `load` in the old mode one more life."""
    return _tpot(old, load) - _tpot(new, load)


def _switch_loss(old: BackendState, new: BackendState, load: float, follow: bool) -> float:
    """GPU time lost, per token of a request life, by switching now: both modes' steps run every round
    until the old mode's requests have drained (their remaining share of a life, in old-mode rounds),
    against serving the same tokens in the new mode alone; where they follow the switch (`follow`), at most
    their re-prefill in the new mode (`BackendState.takeover`)."""
    n_old = old.inflight
    n_new = max(load - n_old, 1.0)
    tokens = old.tau * _running(old, n_old) + new.tau * _running(new, n_new)
    per_token_new = _step(new, load) / (new.tau * _running(new, load))
    extra = _step(old, n_old) + _step(new, n_new) - tokens * per_token_new
    drained = old.remaining / old.tau * extra
    return min(drained, old.takeover) if follow and old.takeover is not None else drained


def _group_option(members: list[BackendState], state: GroupState, present: float, strays_follow: bool) -> _Option | None:
    """The best backend of one group for this request, with its predicted TPOT there. A switch's strays
    follow it to the new mode (`strays_follow`) or end beside it: priced as lasting, they made every switch
    dearer than any load on a group already in the new mode, and one group that switched drew every request."""
    total = sum(b.inflight for b in members)
    open_ = [b for b in members if b.open]
    if not open_:
        return None
    if len(members) == 1:  # partitioned: at its own load
        only = members[0]
        return _Option(only, "adaptive_predicted_faster", _tpot(only, only.inflight + 1), total)
    if state.offered is not None:
        return _rate_option(members, state, strays_follow)
    load = max(total + 1.0, state.load)
    ranked = sorted(members, key=lambda b: (_tpot(b, load), b.name))
    best = next(b for b in ranked if b.open)
    pick, reason = best, "adaptive_predicted_faster" if best is ranked[0] else _closed(ranked[0])
    mode = _mode(members, state)
    if mode is not None and best.speculative != mode:
        stay = next(b for b in members if b.speculative == mode)
        if not stay.open:
            pick, reason = best, _closed(stay)
        elif not (
            _may_leave(stay, best, min(load, present + state.arriving), state, strays_follow)
            if stay.speculative
            else _worth_switching(stay, best, load) and _may_speculate(stay, best, load, state)
        ):
            pick, reason = stay, "adaptive_group_stay"
        else:
            reason = GROUP_SWITCH
    return _priced(pick, reason, members, strays_follow)


def _priced(pick: BackendState, reason: str, members: list[BackendState], strays_follow: bool) -> _Option:
    """`pick` as its group's option, at the TPOT a request joining it would see: where the group switches to
    it and the strays follow, as the new mode carrying the group's whole load; else beside the group's other
    server (draining where this request switches the group)."""
    total = sum(b.inflight for b in members)
    if reason == GROUP_SWITCH and strays_follow:
        moved = replace(pick, inflight=total)
        return _Option(pick, reason, _joined_tpot(moved, [moved]), total)
    return _Option(pick, reason, _joined_tpot(pick, members, drain=reason == GROUP_SWITCH), total)


def _rate_option(members: list[BackendState], state: GroupState, strays_follow: bool) -> _Option | None:
    """Under light traffic (`GroupState.offered`), a co-located group's best backend: the mode whose requests'
    lives are shortest at the rate the group is sent (`rate_tpot`). The group keeps its mode unless the other
    is faster by more than `SWITCH_MARGIN`, and measured as far as its arrivals would meet it: past there
    its line is a prior (plain's flatters it) that no request of the other mode corrects."""
    offered = state.offered
    assert offered is not None
    ranked = sorted(members, key=lambda b: (rate_tpot(b, offered), b.name))
    mode = _mode(members, state)
    want = ranked[0]
    if mode is not None and want.speculative != mode:
        stay = next(b for b in members if b.speculative == mode)
        tpot = rate_tpot(want, offered)
        met = 1.0 + offered * tpot  # what an arrival meets there: the mean in flight (Little) and itself
        assert want.line is not None
        if rate_tpot(stay, offered) <= (1.0 + SWITCH_MARGIN) * tpot or want.line.reach < met:
            want = stay
    pick = want if want.open else next((b for b in ranked if b.open), None)
    if pick is None:
        return None
    reason = GROUP_SWITCH if mode is not None and pick.speculative != mode else "adaptive_predicted_faster"
    if pick is not want:
        reason = _closed(want)
    return _priced(pick, reason, members, strays_follow)


def rate_tpot(b: BackendState, offered: float) -> float:
    """Mean seconds per output token of a request's life on `b` alone when random arrivals send it `offered`
    output tokens a second: the in-flight count is the birth-death chain whose n requests each end at 1 /
    (mean output x TPOT at n), whose mean over its stationary law is, by Little, the rate times the life.
    Infinite where the rate outgrows what `b` carries."""
    if offered <= 0.0:
        return _tpot(b, 1.0)
    weight = total = 1.0
    held = 0.0
    for n in range(1, RATE_LIMIT + 1):
        weight *= offered * _tpot(b, n) / n
        total += weight
        held += n * weight
        if not math.isfinite(held):
            break
        if weight <= RATE_TAIL * total:
            return held / total / offered
    return math.inf


def _left(b: BackendState) -> float:
    """The share of a request's life that `b`'s in-flight requests still have, each: their remaining share
    of output (all of it where unknown)."""
    return b.remaining if b.remaining > 0.0 else 1.0


def _closed(b: BackendState) -> str:
    """The reason a request passed `b` over for the other server of its group."""
    return KV_ROOM if b.full else "adaptive_cap"


def _joined_tpot(pick: BackendState, members: list[BackendState], *, drain: bool = False) -> float:
    """The TPOT a request joining `pick` would see: co-located servers take turns on the GPU, so a round
    is `pick`'s step with it plus the step of every other server of the group that has requests (and it
    waits its turn for KV room where `pick` has none left).

    With `drain`, the other servers' requests are known to end (beside `pick`'s mode, or stranded by a
    switch) and each one's step counts only for the share of this request's life it lasts (its
    requests' remaining output, in its rounds against `pick`'s); without, for all of it."""
    joined = pick.inflight + 1
    others = sum(_step(b, b.inflight) * (_overlap(b, pick) if drain else 1.0) for b in members if b is not pick)
    return (_step(pick, joined) + others) / pick.tau * _stretch(pick, joined)


def _overlap(draining: BackendState, pick: BackendState) -> float:
    """The share of a new request's life on `pick` that `draining`'s in-flight requests still decode
    (unknown remaining output: the whole life)."""
    if draining.remaining <= 0.0:
        return 1.0
    return min(draining.remaining * pick.tau / draining.tau, 1.0)


def _worth_switching(old: BackendState, new: BackendState, load: float, follow: bool = False) -> bool:
    """Whether a group at `load` should leave `old`'s mode for `new`'s: the new mode must be faster by more
    than the noise of the lines (`SWITCH_MARGIN`), and what staying loses over `SWITCH_HORIZON` lives must
    pay for the requests a switch strands in the old mode."""
    gain = _stay_loss(old, new, load)
    return gain > SWITCH_MARGIN * _tpot(new, load) and gain * SWITCH_HORIZON > _switch_loss(old, new, load, follow)


def _may_leave(eagle: BackendState, plain: BackendState, load: float, state: GroupState, follow: bool) -> bool:
    """Whether a group running speculation should turn to plain decode at `load` (the load a request meets over
    its life). Where its EAGLE requests follow the switch at a known re-prefill, that is their price, and
    the gain must hold at the load the group settled at (unless the request comes in a burst, whose size
    that load does not tell): a switch so cheap would otherwise be made at each passing peak of random
    arrivals, mixing the group's modes until it switched back. Else their drain is the price, at `load`."""
    if follow and eagle.takeover is not None:
        return _worth_switching(eagle, plain, load if state.burst else min(load, state.settled), follow=True)
    return _worth_switching(eagle, plain, load)


def _may_speculate(plain: BackendState, eagle: BackendState, load: float, state: GroupState) -> bool:
    """Whether a group running plain decode may turn to speculation: worth it at its settled load too (a
    lull must outlast a few lives), and that load within EAGLE's measured reach."""
    settled = max(load, state.settled)
    assert eagle.line is not None
    return settled <= _edge(eagle) and _worth_switching(plain, eagle, settled)


def _edge(eagle: BackendState) -> float:
    """The most load at which EAGLE's line is taken as measured."""
    assert eagle.line is not None
    return EAGLE_REACH * max(eagle.line.reach, 1.0)


def _mode(members: list[BackendState], state: GroupState) -> bool | None:
    """The mode a co-located group runs: that of its in-flight requests, the one its new requests go to
    while both hold some (a switch draining) or while it is idle (None: never routed to)."""
    busy = {b.speculative for b in members if b.inflight > 0}
    if len(busy) == 1:
        return busy.pop()
    if not busy or state.mode is not None:
        return state.mode
    return max(members, key=lambda b: b.inflight).speculative


def least_harm(snapshot: PoolSnapshot, states: Sequence[BackendState], slo: float) -> tuple[str, str] | None:
    """When no backend meets the TPOT target `slo` with this request: break it for the fewest requests.

    A backend already over the target (or idle) loses only this request; one still within it
    loses all its requests plus this one. None while some backend meets the target.
    """
    loads = {s.name: snapshot.group_inflight(snapshot.get(s.name)) for s in states}
    predicted = {s.name: s.line.at(loads[s.name] + 1) for s in states if s.line is not None}
    if not predicted or min(predicted.values()) <= slo:
        return None

    def harm(s: BackendState) -> int:
        assert s.line is not None
        return 1 if s.inflight == 0 or s.line.at(loads[s.name]) > slo else s.inflight + 1

    best = min((s for s in states if s.line is not None), key=lambda s: (harm(s), predicted[s.name], s.name))
    return best.name, "adaptive_slo"


def lane_view(states: list[BackendState], settings: TierSettings) -> list[BackendState]:
    """Default traffic's view while the lane is kept: partitioned EAGLE lines scaled up by
    `1 / (1 - headroom)`, every EAGLE cap short of `slots`."""
    sizes = Counter(s.group for s in states)
    scale = 1.0 / (1.0 - settings.headroom)
    out = []
    for s in states:
        if not s.speculative:
            out.append(s)
            continue
        line = s.line
        if line is not None and sizes[s.group] == 1:
            line = line.scaled(scale)
        cap = max(s.cap - settings.slots, 0) if s.cap is not None else None
        out.append(replace(s, line=line, cap=cap))
    return out


def flex_choice(states: list[BackendState]) -> str | None:
    """The plain backend where a flex request costs the node least; None when there is none.

    Only plain backends whose group runs no EAGLE request count (co-located, a plain request next to a
    speculating server would interleave both servers' steps); among them the lowest predicted TPOT at
    the group's load, the least-loaded group before any line is fitted.
    """
    loads: Counter[str] = Counter()
    speculating = set()
    for s in states:
        loads[s.group] += s.inflight
        if s.speculative and s.inflight > 0:
            speculating.add(s.group)
    plain = [s for s in states if not s.speculative and s.open and s.group not in speculating]
    if not plain:
        return None

    def cost(s: BackendState) -> tuple[float, int, str]:
        predicted = s.line.at(loads[s.group] + 1) if s.line is not None else 0.0
        return predicted, loads[s.group], s.name

    return min(plain, key=cost).name


@dataclass(frozen=True)
class Stray:
    """A request still decoding on the server its group has just switched away from."""

    key: str  # whoever asks knows it by this
    backend: str
    remaining: float  # output tokens it is expected still to produce
    reprefill: float  # tokens the group's mode server would prefill to take it over: its prompt's uncached part and its output so far


def moves(members: Sequence[BackendState], mode: bool, strays: Sequence[Stray], prefill: float, load: float) -> list[str]:
    """Which strays of a co-located group that has just switched to `mode` move to the mode's server
    (the keys, the most output still to come first).

    A stray moves when, at `load` (the load the switch was priced at, rule 1's L: its in-flight count,
    or the load forecast over the next life where that is higher), the mode decodes faster than the
    kind it runs on and the time its remaining output saves pays for its re-prefill on the mode's
    server (`prefill` seconds a token), which stalls that server's requests as long. Moving also ends
    the stray's steps beside the mode's, which is not counted: the price is a floor on the gain.
    """
    target = next((b for b in members if b.speculative == mode), None)
    if target is None or target.line is None or not target.available:
        return []
    chosen: list[str] = []
    joined = target.inflight
    for stray in sorted(strays, key=lambda s: -s.remaining):
        source = next((b for b in members if b.name == stray.backend), None)
        if source is None or source.line is None or source.speculative == mode:
            continue
        if target.cap is not None and joined >= target.cap:
            break
        gain = _tpot(source, load) - _tpot(target, load)
        if gain <= 0.0 or stray.remaining * gain < prefill * stray.reprefill * (1.0 + joined):
            continue
        chosen.append(stray.key)
        joined += 1
    return chosen


def drain(members: Sequence[BackendState], strays: Sequence[Stray], prefill: float, tail: float, room: float) -> list[str]:
    """Which plain streams of a co-located group move to its EAGLE server while no request arrives: all of
    them or none (a group that kept some on plain would run both servers' steps every round).

    They go when the longest has at least `tail` output tokens still to come, their prompts and whole
    outputs fit the EAGLE server's `room` KV tokens (0: not known), and the decode they save together,
    each one's remaining output at the group's load now, pays `DRAIN_PRICE` times what their re-prefill
    stalls (`prefill` seconds a token, the engine's: every stream on the EAGLE server then waits for all of
    it). Priced as a whole, not each its own (`moves`): a short one that goes along is paid for by
    the long ones, which is what moving all or none buys.
    """
    if not strays or max(s.remaining for s in strays) < tail:
        return []
    if room and sum(s.reprefill + s.remaining for s in strays) > room:
        return []
    target = next((b for b in members if b.speculative), None)
    source = next((b for b in members if not b.speculative), None)
    if target is None or target.line is None or not target.available or source is None or source.line is None:
        return []
    if any(s.backend != source.name for s in strays) or (target.cap is not None and target.inflight + len(strays) > target.cap):
        return []
    load = float(sum(b.inflight for b in members))
    saved = sum(s.remaining for s in strays) * (_tpot(source, load) - _tpot(target, load))
    stall = prefill * sum(s.reprefill for s in strays) * (target.inflight + len(strays))
    if saved <= 0.0 or saved < DRAIN_PRICE * stall:
        return []
    return [s.key for s in sorted(strays, key=lambda s: -s.remaining)]


def first_token_server(chosen: BackendState, members: Sequence[BackendState], uncached: Mapping[str, float]) -> str | None:
    """The server of `chosen`'s co-located group that answers a request's first token before handing it
    over to `chosen` (an EAGLE server), or None.

    Prefill where the prefix lives, decode where it is fast: the group's available plain server whose
    prefix cache leaves it at most `HANDOVER_PREFILL_SHARE` of the prompt tokens `chosen` would
    prefill (`uncached`, per backend). Its first token comes that much sooner; `chosen` then prefills
    the prompt as it would have, while the stream is already answering. The price is that server's
    own prefill and one step beside `chosen`'s, small by this rule.
    """
    if not chosen.speculative:
        return None
    mates = [b for b in members if b.group == chosen.group and not b.speculative and b.available]
    if not mates:
        return None
    best = min(mates, key=lambda b: (uncached.get(b.name, 0.0), b.name))
    own = uncached.get(chosen.name, 0.0)
    return best.name if uncached.get(best.name, 0.0) + 1.0 <= HANDOVER_PREFILL_SHARE * own else None
