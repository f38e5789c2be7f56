"""What the adaptive policy keeps per backend (`Arm`), and what it believes per kind and per group."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.policies.adaptive.fit import Curve, TpotEstimator, merged_curve
from gateway.policies.adaptive.rules import BackendState
from gateway.pool.snapshot import BackendView, PoolSnapshot

# A probe "agrees" when its TPOT is within this share of the fit's prediction.
PROBE_AGREEMENT = 0.15
# A routine probe measures its kind on an idle group, and the probed request pays whatever that kind
# is slower there. Once the fits put a kind more than this share slower than the other at every
# load a group can reach, its probe is not sent: its fit would have to be off by twice what a probe
# counts as agreement before it could win anywhere (docs/adaptive.md#the-decision).
PROBE_OPEN_GAP = 2 * PROBE_AGREEMENT
# Each response's weight in an EAGLE backend's acceptance length: sums decay by this per response.
TAU_DECAY = 0.98


@dataclass
class Arm:
    """What the policy keeps per backend."""

    estimator: TpotEstimator
    probe_interval: int  # decisions without traffic after which it is probed (backs off)
    speculative: bool | None = None  # learned from the first snapshot that lists the backend
    group: str = ""  # likewise; empty until a snapshot listed it
    shared: bool = False  # its group holds another backend (co-located): they share GPUs
    since_routed: int = 0  # decisions since it last received a request
    was_available: bool = False  # as the last routed snapshot showed it
    shared_skipped: int = 0  # co-located: responses not used because the other server was busy
    probe_pending: bool = False  # a probe was sent; its response (the next one seen) judges it
    tau_tokens: float = 0.0  # decayed sums of completion tokens and of token-bearing chunks
    tau_chunks: float = 0.0
    # Its responses seen streamed (with chunk times) and not: one whose responses were never streamed
    # learns its curve and tau from its engine's decode moments instead.
    streamed: int = 0
    unstreamed: int = 0

    @property
    def engine_taught(self) -> bool:
        """Whether its engine's decode moments teach it: its responses come, none of them streamed."""
        return self.unstreamed > 0 and self.streamed == 0

    @property
    def tau(self) -> float:
        """Output tokens per token-bearing chunk (EAGLE: the acceptance length); 1 until measured."""
        return self.tau_tokens / self.tau_chunks if self.tau_chunks > 0.0 else 1.0

    def learn_tau(self, tokens: int, chunks: int) -> None:
        """Add one response's tokens and chunks to the acceptance length."""
        if tokens < 1 or chunks < 1:
            return
        self.tau_tokens = TAU_DECAY * self.tau_tokens + tokens
        self.tau_chunks = TAU_DECAY * self.tau_chunks + chunks

    def describe(self) -> dict[str, Any]:
        return {
            "speculative": self.speculative,
            "group": self.group,
            **self.estimator.describe(),
            "tau": self.tau,
            "shared_skipped": self.shared_skipped,
            "probe_interval": self.probe_interval,
        }


@dataclass(frozen=True)
class Outlook:
    """A backend as `choose` sees it: its arm as `routed` will leave it once it has seen the snapshot."""

    estimator: TpotEstimator | None  # None: never seen, so nothing fitted
    since_routed: int
    probe_interval: int
    evidence: float  # the fit's evidence, for the speculation prior
    tau: float

    @property
    def fitted(self) -> bool:
        return self.estimator is not None and self.estimator.fitted


def listed_arm(new_arm: Callable[[bool | None], Arm], live: Callable[[], PoolSnapshot] | None, name: str) -> Arm:
    """A new arm for backend `name` as the live pool lists it: its kind, group, whether the group is
    shared, whether it is available. An arm this process never routed to (a forced route's response,
    another worker's) then learns as the routing process's arm does, and its first routing is not
    taken for a comeback from an outage (which would re-learn its fit)."""
    snapshot = live() if live is not None else None
    views = [] if snapshot is None else [v for v in snapshot.backends if v.name == name]
    if not views:
        return new_arm(None)
    view = views[0]
    arm = new_arm(view.speculative)
    arm.group, arm.was_available = view.group, view.available
    arm.shared = sum(v.group == view.group for v in snapshot.backends) > 1  # type: ignore[union-attr]
    return arm


def crossover(arms: Iterable[Arm], limit: int = 4096) -> float | None:
    """The load at which the plain arms' pooled curve meets the EAGLE arms' (see AdaptivePolicy.crossover):
    0 when plain is at least as fast alone, infinity when EAGLE is faster up to `limit`."""
    listed = list(arms)
    spec = merged_curve((a.estimator for a in listed if a.speculative), 0.0)
    plain = merged_curve((a.estimator for a in listed if a.speculative is False), 0.0)
    if spec is None or plain is None:
        return None
    gap = spec.at(1) - plain.at(1)  # EAGLE's excess over plain; the crossover is where it reaches 0
    if gap >= 0.0:
        return 0.0
    for n in range(2, limit + 1):
        previous, gap = gap, spec.at(n) - plain.at(n)
        if gap >= 0.0:  # between n - 1 and n: where the straight pieces meet
            return n - 1 + -previous / (gap - previous)
    return math.inf


def in_the_running(mine: Curve, other: Curve, cap: int, shared: bool) -> bool:
    """Whether a kind with line `mine` is within PROBE_OPEN_GAP of the other kind's line at some load a
    group can reach (1 to the EAGLE cap `cap`). Co-located (`shared`), a group runs one mode at a
    time, so the kinds compete at the same load; partitioned, an idle backend competes with the
    other kind's at its fullest."""
    pairs = ((1, 1), (cap, cap)) if shared else ((1, cap),)
    return any(mine.at(a) <= (1.0 + PROBE_OPEN_GAP) * other.at(b) for a, b in pairs)


def group_beliefs(
    snapshot: PoolSnapshot, states: Sequence[BackendState], expected: Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    """Per group: what it runs now, the mode its fits prefer for its expected load, its loads."""
    out: dict[str, dict[str, Any]] = {}
    for view in snapshot.backends:
        out.setdefault(view.group, {"backends": [], "inflight": 0})
        out[view.group]["backends"].append(view.name)
        out[view.group]["inflight"] += view.inflight
    for group, entry in out.items():
        members = [s for s in states if s.group == group]
        busy = {s.speculative for s in members if s.inflight > 0}
        entry["mode"] = "idle" if not busy else "mixed" if len(busy) == 2 else "eagle" if True in busy else "plain"
        entry["expected_load"] = expected.get(group)
        load = max(entry["inflight"] + 1.0, expected.get(group, 0.0))
        fitted = [s for s in members if s.line is not None and s.available]
        if fitted:
            best = min(fitted, key=lambda s: s.line.at(load) if s.line is not None else math.inf)
            entry["preferred_mode"] = "eagle" if best.speculative else "plain"
        entry["remaining"] = {s.name: s.remaining for s in members}
    return out


@dataclass(frozen=True)
class KindLine:
    """One kind's (speculative or not) pooled curve and its evidence."""

    line: Curve
    evidence: float


def kind_lines(available: list[BackendView], outlooks: dict[str, Outlook]) -> dict[bool, KindLine]:
    """Per kind, its fitted backends' bands pooled into one curve, and their evidence."""
    out: dict[bool, KindLine] = {}
    for kind in (False, True):
        estimators = [
            o.estimator for v in available if v.speculative == kind and (o := outlooks[v.name]).estimator is not None and o.fitted
        ]
        evidence = sum(outlooks[v.name].evidence for v in available if v.speculative == kind and outlooks[v.name].fitted)
        config = estimators[0].config if estimators else None
        curve = merged_curve(estimators, config.prior_slope_ratio, far_prior=config.far_prior) if config else None
        if curve is not None:
            out[kind] = KindLine(curve, max(evidence, 1e-9))
    return out


class KindCurves:
    """`kind_lines`, remembered until the listed backends' estimators have learned `REFRESH` more
    responses (fewer while they know little), or the backends listed, or which are fitted, changed:
    pooling the bands is the dearest part of a decision, and a handful of responses barely moves a curve."""

    REFRESH = 8

    def __init__(self) -> None:
        self._key: tuple[tuple[str, bool, bool], ...] | None = None
        self._version = 0
        self._lines: dict[bool, KindLine] = {}
        self.generation = 0  # moves whenever the lines are recomputed

    def of(self, available: list[BackendView], outlooks: dict[str, Outlook]) -> dict[bool, KindLine]:
        key = tuple((v.name, v.speculative, outlooks[v.name].fitted) for v in available)
        version = sum(o.estimator.version for v in available if (o := outlooks[v.name]).estimator is not None)
        needed = min(self.REFRESH, 1 + self._version // 16)  # while evidence is thin, every response counts
        if key != self._key or version - self._version >= needed or version < self._version:
            self._key, self._version, self._lines = key, version, kind_lines(available, outlooks)
            self.generation += 1
        return self._lines

    @property
    def lines(self) -> dict[bool, KindLine]:
        """The lines `of` last gave (none before its first call)."""
        return self._lines
