"""Which (GPU group, mode) a request goes to: the adaptive rule for K groups, and the tier rules, as pure functions.

A group is GPUs running one EAGLE-3 and one plain server co-located (their steps take turns) or one
server alone (partitioned). Per backend: its TPOT line (`alpha + beta*n`), in-flight count, tau and
the share of its in-flight output still to come; per group its recent load. `choose`, reasons in
brackets: (1) a co-located group runs the mode serving its expected load `L = max(n_group + 1,
recent)` fastest [`adaptive_predicted_faster`]; (2) it stays in its current mode while switching
(both servers' steps until the old mode drains) costs more than staying a life in the slower mode
[`adaptive_group_stay`]; (3) the request goes to the group where it is predicted fastest at that
group's total load (alone: the backend's own load); (4) a capped backend gets nothing
[`adaptive_cap`]. The derivation and what each part buys: docs/adaptive.md and
docs/benchmarks/group-policy-model.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.policies.adaptive.fit import Fit
from gateway.policies.lane import TierSettings
from gateway.pool.snapshot import PoolSnapshot

# The rule reads the fit's line: seconds per output token with n requests in flight, `alpha + beta*n`.
TpotLine = Fit


@dataclass(frozen=True)
class BackendState:
    """One backend as the rule sees it."""

    name: str
    group: str  # backends of one group share GPUs; a backend alone in its group is partitioned
    speculative: bool
    available: bool
    inflight: int
    cap: int | None = None  # most requests it may have at once; None: no cap
    line: TpotLine | None = None  # fitted TPOT line; None until fitted
    tau: float = 1.0  # output tokens per decode step per request (EAGLE: the observed acceptance length)
    # Share of their expected output its in-flight requests have still to produce. Unknown: 0, so
    # a group switches at once (a 1 would keep it in its mode for as long as requests keep coming).
    remaining: float = 0.0

    @property
    def open(self) -> bool:
        """Whether it can take one more request."""
        return self.available and (self.cap is None or self.inflight < self.cap)


@dataclass(frozen=True)
class _Option:
    backend: BackendState
    reason: str
    predicted: float  # seconds per token this request is predicted to decode at
    load: int  # the group's in-flight count


def choose(backends: Sequence[BackendState], recent_load: Mapping[str, float] | None = None) -> tuple[str, str]:
    """The backend for one request and the reason label; see the module docstring for the rule.

    `recent_load` maps a group to the mean in-flight count its recent requests ran under (its
    typical load); groups missing from it have none yet.
    """
    available = [b for b in backends if b.available]
    if not available:
        raise ValueError("no backend is available")
    recent = recent_load or {}
    if len(available) == 1:
        return available[0].name, "adaptive_unavailable"
    if any(b.line is None for b in available):
        return _cold(available)
    groups: dict[str, list[BackendState]] = {}
    for b in available:
        groups.setdefault(b.group, []).append(b)
    options = [opt for members in groups.values() if (opt := _group_option(members, recent.get(members[0].group, 0.0)))]
    if not options:  # every backend is at its cap: the least loaded takes the overflow
        least = min(available, key=lambda b: (b.inflight, b.name))
        return least.name, "adaptive_cap"
    best = min(options, key=lambda o: (o.predicted, o.load, o.backend.name))
    return best.backend.name, best.reason


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


def _tpot(b: BackendState, n: float) -> float:
    assert b.line is not None
    return b.line.at(n)


def _step(b: BackendState, n: float) -> float:
    """Predicted step time with n requests running: its tokens per step times its TPOT."""
    return b.tau * _tpot(b, n) if n > 0 else 0.0


def _stay_loss(old: BackendState, new: BackendState, load: float) -> float:
    """GPU time lost, per token of a request life, by keeping the group's `load` in the old mode one more life."""
    return _tpot(old, load) - _tpot(new, load)


def _switch_loss(old: BackendState, new: BackendState, load: float) -> float:
    """GPU time lost, per token of a request life, by switching now: both modes' steps run every round
    until the old mode's requests have drained (their remaining share of a life, in old-mode rounds),
    against serving the same tokens in the new mode alone."""
    n_old = old.inflight
    n_new = max(load - n_old, 1.0)
    tokens = old.tau * n_old + new.tau * n_new
    per_token_new = _step(new, load) / (new.tau * load)
    extra = _step(old, n_old) + _step(new, n_new) - tokens * per_token_new
    return old.remaining / old.tau * extra


def _group_option(members: list[BackendState], recent: float) -> _Option | None:
    """The best backend of one group for this request, with its predicted TPOT there."""
    total = sum(b.inflight for b in members)
    expected = max(total + 1.0, recent)
    ranked = sorted(members, key=lambda b: (_tpot(b, expected if len(members) > 1 else b.inflight + 1), b.name))
    open_ = [b for b in ranked if b.open]
    if not open_:
        return None
    pick, reason = open_[0], "adaptive_predicted_faster" if open_[0] is ranked[0] else "adaptive_cap"
    busy_others = [b for b in members if b is not pick and b.inflight > 0]
    # Without a recent load the group has no history to say whether the old mode's requests will
    # drain together or a larger burst is still arriving: it switches at once.
    if len(members) > 1 and recent > 0.0 and pick.inflight == 0 and busy_others and reason != "adaptive_cap":
        stay = max(busy_others, key=lambda b: b.inflight)
        # The load ahead is at least what has arrived and, in a burst, likely more: at least
        # twice what the old mode already holds.
        ahead = max(expected, 2.0 * stay.inflight)
        if stay.open and _switch_loss(stay, pick, ahead) > _stay_loss(stay, pick, ahead):
            pick, reason = stay, "adaptive_group_stay"
    # Co-located, the request is predicted at the group's total load (steps take turns, so every
    # request in the group slows it): identical groups then fill least-loaded first whatever the
    # lines' errors. Alone, at the backend's own load (the partitioned rule).
    predicted = _tpot(pick, (total if len(members) > 1 else pick.inflight) + 1)
    return _Option(pick, reason, predicted, total)


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
            line = TpotLine(line.alpha * scale, line.beta * scale)
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
