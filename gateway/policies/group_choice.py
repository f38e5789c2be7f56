"""Which (GPU group, mode) a request goes to: the adaptive rule for K groups, as a pure function.

A group is a set of GPUs running one EAGLE-3 server and one plain server co-located (their decode
steps take turns: while both have running requests a round costs step_e(n_e) + step_p(n_p)), or a
single server on GPUs of its own (a group of one: partitioned). Inputs are plain frozen data: per
backend its fitted TPOT line (`TPOT(n) = alpha + beta*n`, gateway/policies/tpot_fit.py), its in-flight
count, its acceptance length `tau` (so its step is `tau * TPOT`), and the share of their output
its in-flight requests have still to produce; per group the load its recent requests ran under.

The rule (`choose`), reasons in brackets:

1. Mode of a co-located group: the one that would serve the group's whole expected load fastest,
   `argmin_m TPOT_m(L)`, `L = max(n_group + 1, recent load)` [`adaptive_predicted_faster`].
   Predicting at the total load makes a group run one mode at a time and switch at the
   crossover; a greedy per-request rule, which sees the other mode's fixed step cost, never
   switches. The recent load keeps a burst's first, lone request off EAGLE when the group has
   been carrying more than one: that request would mix the modes for its whole life.
2. Stay or switch: when the group runs only the other mode, the request stays there
   [`adaptive_group_stay`] while switching costs more than staying, per token of a request life:
   switching pays both servers' steps every round until the other mode's requests drain (their
   remaining share of a life), staying serves the load one more life in the slower mode. The load
   ahead is taken as at least twice what the old mode holds (a burst is likely still arriving).
   Requests that started together so finish together, and the group switches when that costs
   only their last steps. A group with no recent load yet (no history) switches at once.
3. The group: the one where the request is predicted fastest at the group's total load
   (`TPOT_pick(n_group + 1)`; alone, `TPOT_b(n_b + 1)`). Identical groups fill least-loaded first
   whatever the lines' errors; a group of one is today's partitioned rule.
4. A capped backend gets nothing [`adaptive_cap` when it was the faster one]; one backend left
   [`adaptive_unavailable`]; a backend without a fitted line: a lone request speculates, others
   decode plain [`adaptive_prior`].

Measured in benchmarks/group_policy_model.py (docs/benchmarks/group-policy-model.md: closed loop,
128/128 tokens, levels 1..128 in order, against the best of plain, EAGLE and adaptive data
parallel on the same GPUs), given the true lines: worst throughput / TPOT p50 ratio 0.997 / 1.009
on field-8gpu K=1, 0.985 / 1.008 on K=2, 1.000 / 1.000 on llama8b-h100 K=8 (other seeds of the
acceptance draws: 0.979 at worst; tau off by 15%: unchanged). Today's co-located
rule per group: 0.959 (K=1, C=4), 0.940 (K=2, C=4). Each part is needed: without the recent load
(and so without rule 2, which needs history) 0.959 (K=1, C=4); without rule 2 alone 0.973 (K=1) and 0.940
(K=2, C=4); with rule 2 but no progress measured (every request looks just started) the group
never leaves EAGLE at C=2: 0.920. Limits: line errors that move the crossover across a level pick
the wrong mode there, losing up to the true gap between the modes (field-8gpu at C=1..4 with
lines off by 15% in opposite directions: 0.84); a burst after a long idle spell, with no history,
is served as today's rule serves it (0.956 at 4 requests per group on field-8gpu), since its first
request speculates before the rest arrive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.policies.tpot_fit import Fit

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
    # drain together or a larger burst is still arriving: it switches at once, as today's rule.
    if len(members) > 1 and recent > 0.0 and pick.inflight == 0 and busy_others and reason != "adaptive_cap":
        stay = max(busy_others, key=lambda b: b.inflight)
        # The load ahead is at least what has arrived and, in a burst, likely more: at least
        # twice what the old mode already holds.
        ahead = max(expected, 2.0 * stay.inflight)
        if stay.open and _switch_loss(stay, pick, ahead) > _stay_loss(stay, pick, ahead):
            pick, reason = stay, "adaptive_group_stay"
    # Co-located, the request is predicted at the group's total load (steps take turns, so every
    # request in the group slows it): identical groups then fill least-loaded first whatever the
    # lines' errors. Alone, at the backend's own load (today's partitioned rule).
    predicted = _tpot(pick, (total if len(members) > 1 else pick.inflight) + 1)
    return _Option(pick, reason, predicted, total)
