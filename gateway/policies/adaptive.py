"""The adaptive routing policy: send each request where it is predicted to decode fastest.

Each backend has a `TpotEstimator` (gateway/policies/tpot_fit.py) of its time per output token as a
function of its in-flight count, fitted from the responses the gateway relays. A request goes to
the backend whose predicted TPOT, once this request is added, is lowest, within the EAGLE cap.
Rules, in order, each with its own reason label:

1. `adaptive_unavailable`: only one backend can take traffic.
2. While a backend has no fit yet (`adaptive_prior` / `adaptive_explore`): a lone request
   speculates (calibration.md's shape: speculation pays at batch 1), an idle unfitted backend gets
   the request so it is measured, everything else goes to plain decode.
3. `adaptive_explore`: a backend that received nothing in the last `probe_every` decisions gets one
   request, but only while it is idle, so a probe never disturbs a busy server. A probe whose
   response agrees with the fit, or could not be used, doubles that backend's interval (up to
   `PROBE_BACKOFF_LIMIT` times `probe_every`); a surprising one, a re-learn or an outage resets it.
4. `adaptive_slo` (only with a TPOT target, when no backend can take the request within it): the
   backend where it pushes the fewest requests over the target.
5. `adaptive_cap`: EAGLE would be faster but already has `eagle_cap` requests.
6. `adaptive_predicted_faster`: the lower predicted TPOT.

Greedy per request, not system-optimal: every request gets the backend that is best for it, which
in steady state equalizes the two servers' TPOT. That equilibrium is reached by feedback from
measured TPOT even when the fitted slopes are off; the throughput-optimal split depends on the
slopes directly. docs/adaptive.md has the numbers.

Co-located (`colocated`): the servers of one group share one GPU timeline, so a request on one
slows every request on the other, and a split pays both servers' fixed step cost every round. There
each prediction is made at the GROUP's total in-flight count, i.e. "which server would serve the
whole current load faster": a learned threshold at the crossover, with no steady split.

`choose` only reads: what a backend's state will be once `routed` has seen the snapshot (a new
backend, one back from an outage) is worked out without storing it. `routed` then stores it and
moves the per-decision counters (decisions since each backend last got a request, a pending probe).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import PolicyConfig
from gateway.policies.tpot_fit import EstimatorConfig, TpotEstimator
from gateway.policy import Completion, Decision, Policy
from gateway.pool import BackendView, PoolSnapshot

# Weak prior that speculation is the faster choice for the first requests: EAGLE's prediction is
# scaled by 1 - SPEC_PRIOR * w0 / (w0 + evidence), fading as its evidence (in full-length
# responses) grows. It keeps one noisy short warm-up response from parking a lone request on the
# plain server until the next probe.
SPEC_PRIOR = 0.2
SPEC_PRIOR_WEIGHT = 1.0
# Co-located: a response counts only if the other server had at most this many requests in flight
# on average while it decoded.
SHARED_TOLERANCE = 0.25
# A probe costs one request's slowdown when partitioned, but co-located its steps slow every request
# on the other server for as long as it decodes (12% of a level's throughput on llama8b-h100 at
# C=32, docs/adaptive.md), and traffic that arrives meanwhile makes its response unusable. Probes
# that teach nothing new therefore back off exponentially, to at most this many intervals.
PROBE_BACKOFF_LIMIT = 16
# A probe "agrees" when its TPOT is within this share of the fit's prediction.
PROBE_AGREEMENT = 0.15


@dataclass
class _Arm:
    """What the policy keeps per backend."""

    estimator: TpotEstimator
    probe_interval: int  # decisions without traffic after which it is probed (backs off)
    speculative: bool | None = None  # learned from the first snapshot that lists the backend
    since_routed: int = 0  # decisions since it last received a request
    was_available: bool = False  # as the last routed snapshot showed it
    shared_skipped: int = 0  # co-located: responses not used because the other server was busy
    probe_pending: bool = False  # a probe was sent; its response (the next one seen) judges it

    def describe(self) -> dict[str, Any]:
        return {
            "speculative": self.speculative,
            **self.estimator.describe(),
            "shared_skipped": self.shared_skipped,
            "probe_interval": self.probe_interval,
        }


@dataclass(frozen=True)
class _Outlook:
    """A backend as `choose` sees it: its arm as `routed` will leave it once it has seen the snapshot."""

    estimator: TpotEstimator | None  # None: never seen, so nothing fitted
    since_routed: int
    probe_interval: int
    evidence: float  # the fit's evidence, for the speculation prior

    @property
    def fitted(self) -> bool:
        return self.estimator is not None and self.estimator.fitted

    def predict(self, n: float) -> float:
        assert self.estimator is not None
        return self.estimator.predict(n)


class AdaptivePolicy(Policy):
    """Routes by predicted time per output token; learns each backend's TPOT(n) online."""

    name = "adaptive"

    def __init__(
        self,
        eagle_cap: int = 128,
        *,
        slo_tpot: float | None = None,
        probe_every: int = 200,
        colocated: bool = False,
        estimator: EstimatorConfig | None = None,
    ) -> None:
        """`eagle_cap`: most requests EAGLE gets at once; `slo_tpot`: target seconds per token
        (None: off); `probe_every`: decisions without traffic after which an idle backend is
        probed; `colocated`: the servers of a group share one GPU timeline."""
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
        self.estimator = estimator or EstimatorConfig()
        self._arms: dict[str, _Arm] = {}
        self._live: Callable[[], PoolSnapshot] | None = None

    @classmethod
    def from_config(cls, config: PolicyConfig) -> AdaptivePolicy:
        """The policy as the `[policy]` table configures it."""
        slo = config.adaptive_slo_tpot_ms
        return cls(
            config.adaptive_eagle_cap,
            slo_tpot=slo / 1000.0 if slo is not None else None,
            probe_every=config.adaptive_probe_every,
            colocated=bool(config.adaptive_colocated),
            estimator=EstimatorConfig(half_life=config.adaptive_half_life),
        )

    def attach(self, snapshot: Callable[[], PoolSnapshot]) -> None:
        self._live = snapshot

    def choose(self, snapshot: PoolSnapshot) -> Decision:
        spec, plain = _pair(snapshot)
        return self._decide(snapshot, spec, plain, self._outlook(spec), self._outlook(plain))

    def routed(self, snapshot: PoolSnapshot, decision: Decision) -> None:
        spec, plain = _pair(snapshot)
        e, p = self._sync(spec, True), self._sync(plain, False)
        chosen = e if decision.backend == spec.name else p
        if decision.reason == "adaptive_explore" and chosen.estimator.fitted:
            chosen.probe_pending = True  # a probe of a known backend, not a cold-start measurement
        if chosen is e:
            e.since_routed, p.since_routed = 0, p.since_routed + 1
        else:
            e.since_routed, p.since_routed = e.since_routed + 1, 0

    def observe(self, completion: Completion) -> None:
        tokens = completion.output_tokens - 1  # the first token's time is TTFT, not decode
        if tokens < 1 or completion.decode_seconds <= 0.0:
            return
        arm = self._arms.get(completion.backend)
        if arm is None:  # a forced route can finish before the policy ever routed there
            arm = self._arms[completion.backend] = self._new_arm()
        if self.colocated and completion.mean_group_inflight - completion.mean_inflight > SHARED_TOLERANCE:
            # The other server of its group decoded meanwhile and its steps were interleaved with this one's
            # on the shared GPU: this TPOT is not what this server costs on its own.
            arm.shared_skipped += 1
            if arm.probe_pending:
                self._judge_probe(arm, taught_nothing=True)
            return
        n, tpot = completion.mean_inflight, completion.decode_seconds / tokens
        if arm.probe_pending:
            self._judge_probe(arm, taught_nothing=abs(tpot / arm.estimator.predict(n) - 1.0) <= PROBE_AGREEMENT)
        relearns = arm.estimator.relearns
        arm.estimator.observe(n, tpot, tokens)
        if arm.estimator.relearns > relearns:  # this backend changed: the comparison is open again
            for each in self._arms.values():
                each.probe_interval = self.probe_every

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "eagle_cap": self.cap,
            "slo_tpot_seconds": self.slo_tpot,
            "probe_every": self.probe_every,
            "colocated": self.colocated,
            "half_life": self.estimator.half_life,
            "beliefs": self.beliefs(),
        }

    def beliefs(self) -> dict[str, Any]:
        """Fitted lines, predicted TPOT for one more request at the current load, and the crossover."""
        snapshot = self._live() if self._live is not None else None
        views = {b.name: b for b in snapshot.backends} if snapshot else {}
        predicted = {}
        for name, arm in self._arms.items():
            if arm.estimator.fitted:
                view = views.get(name)
                n = self._load(snapshot, view) if snapshot is not None and view is not None else 0
                factor = self._spec_factor(arm.estimator.evidence) if arm.speculative else 1.0
                predicted[name] = arm.estimator.predict(n + 1) * factor
        beliefs: dict[str, Any] = {
            "predicted_tpot_seconds": predicted,
            "backends": {name: arm.describe() for name, arm in self._arms.items()},
        }
        crossover = self.crossover()
        if crossover is not None:
            beliefs["crossover_concurrency"] = crossover
        return beliefs

    def crossover(self) -> float | None:
        """The batch size from which a plain server decodes faster than the EAGLE one, per the fits.

        Where the two fitted lines cross (calibration.md's crossover); 0 when plain is faster at
        every load, infinity when EAGLE is, None until both are fitted.
        """
        spec = next((a.estimator for a in self._arms.values() if a.speculative), None)
        plain = next((a.estimator for a in self._arms.values() if a.speculative is False), None)
        if spec is None or plain is None or not (spec.fitted and plain.fitted):
            return None
        gap = plain.alpha - spec.alpha  # how much slower plain is at zero load
        slope_gap = spec.beta - plain.beta  # how much faster EAGLE's TPOT grows per request
        if gap <= 0.0:
            return 0.0 if slope_gap >= 0.0 else math.inf
        if slope_gap <= 0.0:
            return math.inf
        return gap / slope_gap

    def _new_arm(self) -> _Arm:
        return _Arm(TpotEstimator(self.estimator), probe_interval=self.probe_every)

    def _comes_back(self, arm: _Arm, view: BackendView) -> bool:
        """Available again after the last routed snapshot showed it unavailable, with a fit to revise."""
        return view.available and not arm.was_available and arm.estimator.fitted

    def _outlook(self, view: BackendView) -> _Outlook:
        arm = self._arms.get(view.name)
        if arm is None:
            return _Outlook(None, 0, self.probe_every, 0.0)
        if self._comes_back(arm, view):  # what `_sync` will do, without doing it
            keep = self.estimator.relearn_keep
            return _Outlook(arm.estimator, self.probe_every, self.probe_every, arm.estimator.evidence * keep)
        return _Outlook(arm.estimator, arm.since_routed, arm.probe_interval, arm.estimator.evidence)

    def _sync(self, view: BackendView, speculative: bool) -> _Arm:
        arm = self._arms.get(view.name)
        if arm is None:
            arm = self._arms[view.name] = self._new_arm()
        arm.speculative = speculative
        if self._comes_back(arm, view):
            # Back after an outage (a restart, maybe with other settings): re-learn fast from
            # the old fit, and measure it at the next idle moment.
            arm.estimator.forget(self.estimator.relearn_keep)
            arm.probe_interval = arm.since_routed = self.probe_every
        arm.was_available = view.available
        return arm

    def _load(self, snapshot: PoolSnapshot, view: BackendView) -> int:
        """The in-flight count a backend's TPOT depends on: its group's when co-located, else its own."""
        return snapshot.group_inflight(view) if self.colocated else view.inflight

    def _judge_probe(self, arm: _Arm, *, taught_nothing: bool) -> None:
        """Back the backend's probe interval off after a probe that taught nothing, else reset it."""
        arm.probe_pending = False
        if taught_nothing:
            arm.probe_interval = min(2 * arm.probe_interval, PROBE_BACKOFF_LIMIT * self.probe_every)
        else:
            arm.probe_interval = self.probe_every

    def _spec_factor(self, evidence: float) -> float:
        return 1.0 - SPEC_PRIOR * SPEC_PRIOR_WEIGHT / (SPEC_PRIOR_WEIGHT + evidence)

    def _decide(self, snapshot: PoolSnapshot, spec: BackendView, plain: BackendView, e: _Outlook, p: _Outlook) -> Decision:
        if not (spec.available and plain.available):
            return Decision(plain.name if plain.available else spec.name, "adaptive_unavailable")
        n_e, n_p = spec.inflight, plain.inflight
        load_e, load_p = self._load(snapshot, spec), self._load(snapshot, plain)
        eagle_open = n_e < self.cap
        # A probe must measure the backend on its own: idle itself, and on a shared GPU its group
        # idle too (the other server's steps would be interleaved with the probe's).
        idle = n_e + n_p == 0
        probe_e = eagle_open and load_e == 0
        probe_p = load_p == 0
        if not (e.fitted and p.fitted):
            if not p.fitted and probe_p and (e.fitted or not idle):
                return Decision(plain.name, "adaptive_explore")
            if idle and eagle_open:
                return Decision(spec.name, "adaptive_prior")
            if not e.fitted and probe_e:
                return Decision(spec.name, "adaptive_explore")
            return Decision(plain.name, "adaptive_prior")
        if p.since_routed >= p.probe_interval and probe_p:
            return Decision(plain.name, "adaptive_explore")
        if e.since_routed >= e.probe_interval and probe_e:
            return Decision(spec.name, "adaptive_explore")
        pred_e = e.predict(load_e + 1) * self._spec_factor(e.evidence)
        pred_p = p.predict(load_p + 1)
        if self.slo_tpot is not None and eagle_open and min(pred_e, pred_p) > self.slo_tpot:
            return self._least_harm(spec, plain, e, p, (load_e, load_p), pred_e < pred_p)
        if pred_e < pred_p:
            return Decision(spec.name, "adaptive_predicted_faster") if eagle_open else Decision(plain.name, "adaptive_cap")
        return Decision(plain.name, "adaptive_predicted_faster")

    def _least_harm(
        self, spec: BackendView, plain: BackendView, e: _Outlook, p: _Outlook, loads: tuple[int, int], eagle_faster: bool
    ) -> Decision:
        """Neither backend meets the TPOT target with this request: break it for the fewest requests.

        A backend already over the target (or idle) loses only this request; one still within it
        loses all its requests plus this one.
        """
        slo = self.slo_tpot
        assert slo is not None
        load_e, load_p = loads
        harm_e = 1 if spec.inflight == 0 or e.predict(load_e) * self._spec_factor(e.evidence) > slo else spec.inflight + 1
        harm_p = 1 if plain.inflight == 0 or p.predict(load_p) > slo else plain.inflight + 1
        if harm_e < harm_p or (harm_e == harm_p and eagle_faster):
            return Decision(spec.name, "adaptive_slo")
        return Decision(plain.name, "adaptive_slo")


def _pair(snapshot: PoolSnapshot) -> tuple[BackendView, BackendView]:
    """The speculative and the plain backend of the snapshot."""
    spec = plain = snapshot.backends[0]
    for view in snapshot.backends:
        if view.speculative:
            spec = view
        else:
            plain = view
    return spec, plain
