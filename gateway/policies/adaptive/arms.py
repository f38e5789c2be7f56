"""What the adaptive policy keeps per backend (`Arm`), and what it believes per kind and per group."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.policies.adaptive.fit import TpotEstimator
from gateway.policies.adaptive.rules import BackendState, TpotLine
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


def listed_arm(arm: Arm, live: Callable[[], PoolSnapshot] | None, name: str) -> Arm:
    """`arm`, new, for backend `name` as the live pool lists it: its kind, group, whether the group is
    shared, whether it is available. An arm this process never routed to (a forced route's response,
    another worker's) then learns as the routing process's arm does, and its first routing is not
    taken for a comeback from an outage (which would re-learn its fit)."""
    snapshot = live() if live is not None else None
    views = [] if snapshot is None else [v for v in snapshot.backends if v.name == name]
    if views:
        view = views[0]
        arm.speculative, arm.group, arm.was_available = view.speculative, view.group, view.available
        arm.shared = sum(v.group == view.group for v in snapshot.backends) > 1  # type: ignore[union-attr]
    return arm


def crossover(arms: Iterable[Arm]) -> float | None:
    """Where the first EAGLE and the first plain arm's fitted lines cross (see AdaptivePolicy.crossover)."""
    listed = list(arms)
    spec = next((a.estimator for a in listed if a.speculative), None)
    plain = next((a.estimator for a in listed if a.speculative is False), None)
    if spec is None or plain is None or not (spec.fitted and plain.fitted):
        return None
    gap = plain.alpha - spec.alpha  # how much slower plain is at zero load
    slope_gap = spec.beta - plain.beta  # how much faster EAGLE's TPOT grows per request
    if gap <= 0.0:
        return 0.0 if slope_gap >= 0.0 else math.inf
    if slope_gap <= 0.0:
        return math.inf
    return gap / slope_gap


def in_the_running(mine: TpotLine, other: TpotLine, cap: int, shared: bool) -> bool:
    """Whether a kind with line `mine` is within PROBE_OPEN_GAP of the other kind's line at some load a
    group can reach (1 to the EAGLE cap `cap`). Co-located (`shared`), a group runs one mode at a
    time, so the kinds compete at the same load; partitioned, an idle backend competes with the
    other kind's at its fullest."""
    pairs = ((1, 1), (cap, cap)) if shared else ((1, cap),)
    return any(mine.at(a) <= (1.0 + PROBE_OPEN_GAP) * other.at(b) for a, b in pairs)


def group_beliefs(
    snapshot: PoolSnapshot, states: Sequence[BackendState], recent: Mapping[str, float]
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
        entry["recent_load"] = recent.get(group)
        load = max(entry["inflight"] + 1.0, recent.get(group, 0.0))
        fitted = [s for s in members if s.line is not None and s.available]
        if fitted:
            best = min(fitted, key=lambda s: s.line.at(load) if s.line is not None else math.inf)
            entry["preferred_mode"] = "eagle" if best.speculative else "plain"
        entry["remaining"] = {s.name: s.remaining for s in members}
    return out


def kind_lines(available: list[BackendView], outlooks: dict[str, Outlook]) -> dict[bool, tuple[TpotLine, float]]:
    """Per kind (speculative or not), its fitted backends' lines averaged by evidence, and their evidence."""
    sums: dict[bool, list[float]] = {}  # kind -> [evidence, evidence*alpha, evidence*beta]
    for view in available:
        outlook = outlooks[view.name]
        estimator = outlook.estimator
        if estimator is not None and estimator.fitted:
            weight = max(outlook.evidence, 1e-9)
            acc = sums.setdefault(view.speculative, [0.0, 0.0, 0.0])
            acc[0] += weight
            acc[1] += weight * estimator.alpha
            acc[2] += weight * estimator.beta
    return {kind: (TpotLine(a / w, b / w), w) for kind, (w, a, b) in sums.items()}
