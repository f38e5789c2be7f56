"""The adaptive policy's decision rule on hand-built snapshots and hand-computed predictions.

Estimators are trained with exact points from known lines, so every prediction below can be
worked out by hand: TPOT(n) = alpha + beta*n. The policy is driven only through its public steps,
as the gateway drives it: `choose`, then `routed` once the request is placed, and `observe`.
"""

from __future__ import annotations

import math

import pytest

from gateway.config import PolicyConfig
from gateway.policies import Completion, Decision, Progress, route
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.adaptive.fit import TpotCurve, TpotLine
from gateway.policies.adaptive.policy import SPEC_PRIOR
from gateway.policies.factory import make_policy
from gateway.pool.snapshot import BackendView, PoolSnapshot

MS = 1e-3
# field-8gpu's lines (calibration.md), seconds: EAGLE (5.82 + 8.47n)/3, plain 4.53 + 1.294n.
FIELD_EAGLE = TpotLine(1.94 * MS, 8.47 / 3 * MS)
FIELD_PLAIN = TpotLine(4.53 * MS, 1.294 * MS)
# llama8b-h100's: EAGLE (10.71 + 0.149n)/2.9, plain 6.27 + 0.045n.
LLAMA_EAGLE = TpotLine(10.71 / 2.9 * MS, 0.149 / 2.9 * MS)
LLAMA_PLAIN = TpotLine(6.27 * MS, 0.045 * MS)


def snap(eagle: int, plain: int, *, eagle_up: bool = True, plain_up: bool = True, group: str = "", at: float = 0.0) -> PoolSnapshot:
    """Two backends; with no `group` each is a group of its own (partitioned). `at`: the pool's clock."""
    return PoolSnapshot(
        (BackendView("eagle", True, eagle_up, eagle, group), BackendView("plain", False, plain_up, plain, group)), at
    )


def shared(eagle: int, plain: int, at: float = 0.0) -> PoolSnapshot:
    """Both backends in one group: co-located on the same GPUs."""
    return snap(eagle, plain, group="g0", at=at)


def completion(backend: str, line: TpotLine, n: float, tokens: int = 129, others: float = 0.0) -> Completion:
    """A response that decoded at `line`'s TPOT with `n` in flight on its backend, `others` on the rest."""
    decode = line.at(n) * (tokens - 1)
    return Completion(backend, tokens, ttft=0.02, decode_seconds=decode, mean_inflight=n, mean_group_inflight=n + others)


def decide(policy: AdaptivePolicy, snapshot: PoolSnapshot) -> Decision:
    """One request routed as the gateway routes it: the decision, then the step that records it."""
    decision = policy.choose(snapshot)
    policy.routed(snapshot, decision)
    return decision


def trained(eagle: TpotLine, plain: TpotLine, *, points: int = 400, **kwargs: object) -> AdaptivePolicy:
    """A policy that has seen `points` exact responses per backend at loads 1..16, spread evenly."""
    policy = AdaptivePolicy(**kwargs)  # type: ignore[arg-type]
    decide(policy, snap(0, 0))  # learns which backend is the speculative one
    for i in range(points):
        n = 1 + i % 16
        policy.observe(completion("eagle", eagle, n))
        policy.observe(completion("plain", plain, n))
    return policy


def recent_traffic(policy: AdaptivePolicy) -> None:
    """Both backends just had a request (EAGLE one decision ago, plain the last one): no probe is due."""
    policy.routed(snap(0, 0), Decision("eagle", "adaptive_predicted_faster"))
    policy.routed(snap(1, 0), Decision("plain", "adaptive_predicted_faster"))


def steady(policy: AdaptivePolicy, eagle: int, plain: int) -> Decision:
    """A decision when both backends have recently had traffic (no probe due)."""
    recent_traffic(policy)
    return policy.choose(shared(eagle, plain) if policy.colocated else snap(eagle, plain))


def curve_at(policy: AdaptivePolicy, backend: str, n: float) -> float:
    """The backend's learned TPOT at `n` in flight, from its measured points as /admin/status lists them."""
    points = policy.beliefs()["backends"][backend]["points"]
    return TpotCurve(tuple((p[0], p[1]) for p in points), 0.0, 0.0).at(n)


def spec_factor(policy: AdaptivePolicy) -> float:
    """The speculation prior's factor on EAGLE's prediction, read from the beliefs of an idle pool."""
    policy.attach(lambda: snap(0, 0))
    return policy.beliefs()["predicted_tpot_seconds"]["eagle"] / curve_at(policy, "eagle", 1)


def test_learned_curves_are_the_truth() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN)
    for n in (1, 2, 3, 5, 8, 12, 16):
        assert curve_at(policy, "eagle", n) == pytest.approx(FIELD_EAGLE.at(n), rel=1e-2)
        assert curve_at(policy, "plain", n) == pytest.approx(FIELD_PLAIN.at(n), rel=1e-2)


@pytest.mark.parametrize(
    ("eagle", "plain", "expected"),
    [
        # field-8gpu: EAGLE(1) = 4.76 ms < plain(1) = 5.82 ms: a lone request speculates.
        (0, 0, "eagle"),
        # EAGLE(2) = 7.59 ms > plain(1) = 5.82 ms.
        (1, 0, "plain"),
        # EAGLE(2) = 7.59 < plain(3) = 8.41.
        (1, 2, "eagle"),
        # EAGLE(12) = 35.8 vs plain(25) = 36.9: EAGLE; EAGLE(13) = 38.6 vs plain(25): plain.
        (11, 24, "eagle"),
        (12, 24, "plain"),
    ],
)
def test_field_profile_lowest_predicted_tpot_wins(eagle: int, plain: int, expected: str) -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN)
    assert steady(policy, eagle, plain) == Decision(expected, "adaptive_predicted_faster")


@pytest.mark.parametrize(
    ("eagle", "plain", "expected"),
    [
        # llama8b-h100: EAGLE(n) < plain(1) = 6.315 ms until n = 51: EAGLE(51) = 6.313, EAGLE(52) = 6.365.
        (50, 0, "eagle"),
        (51, 0, "plain"),
        # With plain busy, EAGLE keeps winning far beyond SGLang's 48: EAGLE(81) = 7.85 < plain(41) = 8.12.
        (80, 40, "eagle"),
    ],
)
def test_llama_profile_lowest_predicted_tpot_wins(eagle: int, plain: int, expected: str) -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN)
    assert steady(policy, eagle, plain) == Decision(expected, "adaptive_predicted_faster")


def test_crossover_is_where_the_lines_meet() -> None:
    # field: 1.94 + 2.823n = 4.53 + 1.294n at n = 2.59 / 1.529 = 1.69 ("about 2").
    assert trained(FIELD_EAGLE, FIELD_PLAIN).crossover() == pytest.approx(1.694, rel=1e-2)
    # llama: 3.693 + 0.0514n = 6.27 + 0.045n at n = 2.577 / 0.00638 = 404.
    assert trained(LLAMA_EAGLE, LLAMA_PLAIN).crossover() == pytest.approx(404, rel=2e-2)
    # EAGLE faster at every load: never; plain faster at every load: from the start.
    assert trained(TpotLine(1 * MS, 0.1 * MS), TpotLine(2 * MS, 0.2 * MS)).crossover() == math.inf
    assert trained(TpotLine(3 * MS, 0.1 * MS), TpotLine(2 * MS, 0.1 * MS)).crossover() == 0.0


def test_cap_sends_the_overflow_to_plain_even_when_eagle_is_faster() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, eagle_cap=48)
    assert steady(policy, 47, 0) == Decision("eagle", "adaptive_predicted_faster")
    assert steady(policy, 48, 0) == Decision("plain", "adaptive_cap")
    assert steady(policy, 48, 60) == Decision("plain", "adaptive_cap")
    # Not a cap decision when plain is the faster one anyway.
    assert steady(trained(FIELD_EAGLE, FIELD_PLAIN, eagle_cap=2), 2, 0) == Decision("plain", "adaptive_predicted_faster")


def test_unavailable_backend_gets_nothing() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN)
    assert policy.choose(snap(0, 0, eagle_up=False)) == Decision("plain", "adaptive_unavailable")
    assert policy.choose(snap(0, 0, plain_up=False)) == Decision("eagle", "adaptive_unavailable")
    assert route(policy, snap(0, 0, eagle_up=False, plain_up=False)) is None


def test_a_backend_back_from_an_outage_is_relearned_and_probed() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN)
    decide(policy, snap(5, 0, plain_up=False))
    decision = decide(policy, snap(5, 0))  # plain is back: probe it while it is idle
    assert decision == Decision("plain", "adaptive_explore")
    assert policy.beliefs()["backends"]["plain"]["effective_observations"] < 20  # most old evidence dropped


def test_choose_changes_nothing() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, probe_every=10)
    recent_traffic(policy)
    before = policy.describe()
    # Asked again and again (no request placed), the answer stays: no counter moves toward a probe.
    assert {policy.choose(snap(3, 0)) for _ in range(50)} == {Decision("eagle", "adaptive_predicted_faster")}
    # A backend back from an outage: choose already decides as if re-learning, but stores nothing.
    decide(policy, snap(5, 0, plain_up=False))
    before = policy.describe()
    assert policy.choose(snap(5, 0)) == Decision("plain", "adaptive_explore")
    assert policy.choose(snap(5, 0)) == Decision("plain", "adaptive_explore")
    assert policy.describe() == before


def test_cold_start_lone_request_speculates_and_each_backend_gets_measured() -> None:
    policy = AdaptivePolicy()
    assert decide(policy, snap(0, 0)) == Decision("eagle", "adaptive_prior")
    assert decide(policy, snap(1, 0)) == Decision("plain", "adaptive_explore")
    assert decide(policy, snap(1, 1)) == Decision("plain", "adaptive_prior")
    policy.observe(completion("plain", FIELD_PLAIN, 1))
    # plain measured, EAGLE not yet: an idle EAGLE gets the next request, a busy one does not.
    assert decide(policy, snap(0, 3)) == Decision("eagle", "adaptive_explore")
    assert decide(policy, snap(1, 3)) == Decision("plain", "adaptive_prior")


def test_exploration_is_bounded_to_idle_backends_every_n_decisions() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, probe_every=10)
    recent_traffic(policy)
    reasons = [decide(policy, snap(3, 0)).reason for _ in range(100)]
    # Plain is idle and slower at this load: one probe per 10 decisions, no more.
    assert reasons.count("adaptive_explore") == 100 // 11
    # A busy backend is never probed, however long it has been.
    for _ in range(1000):
        policy.routed(snap(3, 1), Decision("eagle", "adaptive_predicted_faster"))
    assert policy.choose(snap(3, 1)) == Decision("eagle", "adaptive_predicted_faster")


def test_slo_mode_keeps_the_most_requests_within_target() -> None:
    # field lines, target 30 ms per token: EAGLE holds 9 (EAGLE(10) = 30.2), plain 19 (plain(20) = 30.4).
    policy = trained(FIELD_EAGLE, FIELD_PLAIN, slo_tpot=0.030)
    # Room on one of them: as without a target.
    assert steady(policy, 9, 10) == Decision("plain", "adaptive_predicted_faster")
    # Both full: the new request goes where it breaks the target for the fewest requests. Both
    # are within target now, so that is the one with fewer requests (9 + 1 < 19 + 1).
    assert steady(policy, 9, 19) == Decision("eagle", "adaptive_slo")
    # Once EAGLE is past the target, further overflow stays there and plain's 19 keep theirs.
    assert steady(policy, 11, 19) == Decision("eagle", "adaptive_slo")
    # Without the target, greedy would have spread the overflow over both: EAGLE(12) > plain(20).
    assert steady(trained(FIELD_EAGLE, FIELD_PLAIN), 11, 19) == Decision("plain", "adaptive_predicted_faster")


def test_slo_mode_respects_the_cap() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN, slo_tpot=0.030, eagle_cap=9)
    assert steady(policy, 9, 19) == Decision("plain", "adaptive_cap")


def test_colocated_compares_whole_load_on_one_server() -> None:
    """One GPU timeline: 'which server would run all of it faster' (a learned threshold)."""
    colocated = trained(FIELD_EAGLE, FIELD_PLAIN, colocated=True)
    # 0 + 1 in flight: EAGLE(2) = 7.59 > plain(2) = 7.12: plain, even though EAGLE itself is empty.
    assert steady(colocated, 0, 1) == Decision("plain", "adaptive_predicted_faster")
    # Partitioned, the idle EAGLE server would take it: EAGLE(1) = 4.76 < plain(2) = 7.12.
    assert steady(trained(FIELD_EAGLE, FIELD_PLAIN), 0, 1) == Decision("eagle", "adaptive_predicted_faster")
    assert steady(colocated, 0, 0) == Decision("eagle", "adaptive_predicted_faster")


def test_colocated_predictions_count_only_the_backends_sharing_gpus() -> None:
    """The load a prediction uses is the backend's group's: with each backend alone in its group,
    a co-located policy decides as a partitioned one does."""
    colocated = trained(FIELD_EAGLE, FIELD_PLAIN, colocated=True)
    recent_traffic(colocated)
    assert colocated.choose(snap(0, 1)) == Decision("eagle", "adaptive_predicted_faster")
    assert colocated.choose(shared(0, 1)) == Decision("plain", "adaptive_predicted_faster")


def test_colocated_learns_only_from_responses_that_had_the_gpu_to_themselves() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN, colocated=True)
    before = policy.beliefs()["backends"]["plain"]
    # A plain response that decoded while EAGLE had 3 requests interleaved: three times slower.
    for _ in range(50):
        policy.observe(completion("plain", TpotLine(FIELD_PLAIN.alpha * 3, FIELD_PLAIN.beta * 3), 1, others=3))
    after = policy.beliefs()["backends"]["plain"]
    assert after["points"] == before["points"]
    assert after["shared_skipped"] == 50
    # Partitioned, the same responses are the plain server's real TPOT and are learned.
    partitioned = trained(FIELD_EAGLE, FIELD_PLAIN)
    for _ in range(50):
        partitioned.observe(completion("plain", TpotLine(FIELD_PLAIN.alpha * 3, FIELD_PLAIN.beta * 3), 1, others=3))
    assert curve_at(partitioned, "plain", 1) > 1.5 * FIELD_PLAIN.at(1)


def test_colocated_probes_only_when_the_whole_gpu_is_idle() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, colocated=True, probe_every=5)
    recent_traffic(policy)
    reasons = [decide(policy, shared(3, 0, at=0.01 * k)).reason for k in range(20)]
    assert "adaptive_explore" not in reasons  # plain is idle, but EAGLE's steps would interleave
    # Right after, the group has been carrying four: a probe would likely decode beside EAGLE's.
    assert decide(policy, shared(0, 0, at=0.25)).reason != "adaptive_explore"
    # Quiet for a while (the lives `forecast.py` reads), the probe goes.
    assert decide(policy, shared(0, 0, at=60.0)) == Decision("plain", "adaptive_explore")


def decisions_until_probe(policy: AdaptivePolicy, limit: int = 10_000) -> int:
    """Decisions at a load where plain is idle and slower (llama lines) until plain is probed."""
    for count in range(1, limit + 1):
        if decide(policy, snap(3, 0)) == Decision("plain", "adaptive_explore"):
            return count
    raise AssertionError(f"no probe in {limit} decisions")


def test_probes_that_agree_back_off_and_a_surprise_resets_them() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, probe_every=10)
    recent_traffic(policy)
    gaps = []
    for _ in range(6):
        gaps.append(decisions_until_probe(policy))
        policy.observe(completion("plain", LLAMA_PLAIN, 1))  # the probe: exactly as fitted
    # Each agreeing probe doubles the wait, up to 16 intervals (each gap includes the probe).
    assert gaps == [11, 21, 41, 81, 161, 161]
    assert policy.beliefs()["backends"]["plain"]["probe_interval"] == 160
    # A probe that finds plain 40% faster than believed: back to probing every 10 decisions.
    decisions_until_probe(policy)
    policy.observe(completion("plain", TpotLine(LLAMA_PLAIN.alpha * 0.6, LLAMA_PLAIN.beta), 1))
    assert decisions_until_probe(policy) == 11


def quiet_spell(policy: AdaptivePolicy, at: float = 0.0) -> None:
    """Lone requests on the co-located group g0 from `at`: its recent load settles near 1, so probes may run."""
    policy.routed(shared(0, 0, at), Decision("eagle", "adaptive_predicted_faster"))
    for _ in range(30):
        policy.observe(completion("eagle", LLAMA_EAGLE, 1))


def test_colocated_probe_whose_response_was_shared_backs_off() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, colocated=True, probe_every=10)
    quiet_spell(policy)
    recent_traffic(policy)
    for k in range(10):
        decide(policy, shared(3, 0, at=0.01 * k))
    assert decide(policy, shared(0, 0, at=60.0)) == Decision("plain", "adaptive_explore")
    # EAGLE got busy while the probe decoded: its TPOT is not plain's own, and it taught nothing.
    policy.observe(completion("plain", TpotLine(LLAMA_PLAIN.alpha * 3, LLAMA_PLAIN.beta), 1, others=20))
    plain = policy.beliefs()["backends"]["plain"]
    assert plain["shared_skipped"] == 1 and plain["probe_interval"] == 20
    for k in range(20):
        assert decide(policy, shared(0, 0, at=60.01 + 0.01 * k)).backend == "eagle"
    quiet_spell(policy, at=61.0)  # the shared response said the group was busy: probes wait for quiet again
    assert decide(policy, shared(0, 0, at=61.0)) == Decision("plain", "adaptive_explore")


def test_a_kind_never_measured_alone_is_probed_until_its_lone_responses_are_a_point() -> None:
    """EAGLE first measured at a busy moment (three requests at once) and carried down to one request at
    its prior slope looks over 30% slower than plain there: out of the running, and with no request
    sent there nothing would correct it. It is probed whenever its group is quiet until its responses
    alone make a point of its curve (three), and then a lone request speculates again."""
    policy = AdaptivePolicy(colocated=True, probe_every=10)
    decide(policy, shared(0, 0))  # learns which backend is the speculative one
    for i in range(40):
        policy.observe(completion("eagle", FIELD_EAGLE, 3))
        policy.observe(completion("plain", FIELD_PLAIN, 1 + i % 2))
    predicted = policy.beliefs()["predicted_tpot_seconds"]
    assert predicted["eagle"] > 1.3 * predicted["plain"]  # the trap: EAGLE priced out at light load
    decide(policy, shared(0, 1, at=1.0))  # EAGLE just passed over: its probe interval has not run
    for k in range(3):
        assert decide(policy, shared(0, 0, at=2.0 + k)) == Decision("eagle", "adaptive_explore")
        policy.observe(completion("eagle", FIELD_EAGLE, 1))
    for _ in range(8):  # plain's responses meanwhile: the pooled curves are redrawn every few responses
        policy.observe(completion("plain", FIELD_PLAIN, 1))
    decision = decide(policy, shared(0, 0, at=10.0))
    assert decision.backend == "eagle" and decision.reason != "adaptive_explore"


def test_a_never_measured_kind_whose_probe_taught_nothing_waits_its_backoff() -> None:
    policy = AdaptivePolicy(colocated=True, probe_every=10)
    decide(policy, shared(0, 0))
    for i in range(40):
        policy.observe(completion("eagle", FIELD_EAGLE, 3))
        policy.observe(completion("plain", FIELD_PLAIN, 1 + i % 2))
    assert decide(policy, shared(0, 0, at=1.0)) == Decision("eagle", "adaptive_explore")
    # Plain's requests arrived while the probe decoded: its TPOT is not EAGLE's own, and it taught nothing.
    policy.observe(completion("eagle", FIELD_EAGLE, 1, others=2))
    assert policy.beliefs()["backends"]["eagle"]["probe_interval"] == 20
    for k in range(10):  # the backoff's added interval passes on plain
        assert decide(policy, shared(0, 0, at=2.0 + k)).backend == "plain"
    assert decide(policy, shared(0, 0, at=12.0)) == Decision("eagle", "adaptive_explore")


def test_no_colocated_probe_in_a_busy_spell() -> None:
    """A probe that lands on a group between bursts would mix the modes for its whole life."""
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, colocated=True, probe_every=10)  # a life of about 0.5 s
    views = (BackendView("eagle", True, True, 16, "g0"), BackendView("plain", False, True, 0, "g0"))
    for step in range(40):  # two seconds of 16 requests in flight
        policy.routed(PoolSnapshot(views, 0.05 * step), Decision("eagle", "adaptive_predicted_faster"))
    idle = (BackendView("eagle", True, True, 0, "g0"), BackendView("plain", False, True, 0, "g0"))
    # A lull right after the spell: the group has been carrying 16, whatever it holds now.
    assert policy.choose(PoolSnapshot(idle, 2.1)).reason != "adaptive_explore"
    # Once it has been quiet for a few lives, the overdue probe goes.
    assert policy.choose(PoolSnapshot(idle, 30.0)) == Decision("plain", "adaptive_explore")


def test_a_relearn_or_an_outage_resets_the_probe_interval() -> None:
    policy = trained(LLAMA_EAGLE, LLAMA_PLAIN, probe_every=10)
    recent_traffic(policy)
    backed_off(policy)
    # EAGLE's acceptance drops (TPOT +50%): once its fit re-learns, plain is worth checking again.
    slower = TpotLine(LLAMA_EAGLE.alpha * 1.5, LLAMA_EAGLE.beta * 1.5)
    for i in range(100):
        policy.observe(completion("eagle", slower, 1 + i % 16))
    backends = policy.beliefs()["backends"]
    assert backends["eagle"]["relearns"] == 1
    assert backends["eagle"]["probe_interval"] == backends["plain"]["probe_interval"] == 10
    backed_off(policy)
    decide(policy, snap(5, 0, plain_up=False))
    decide(policy, snap(5, 0))
    assert policy.beliefs()["backends"]["plain"]["probe_interval"] == 10


def backed_off(policy: AdaptivePolicy) -> None:
    """Four probes of plain that confirm its fit: its probe interval backs off from 10 to 160 decisions."""
    for _ in range(4):
        decisions_until_probe(policy)
        policy.observe(completion("plain", LLAMA_PLAIN, 1))
    assert policy.beliefs()["backends"]["plain"]["probe_interval"] == 160


def test_colocated_cold_start_measures_each_server_alone() -> None:
    policy = AdaptivePolicy(colocated=True)
    assert decide(policy, shared(0, 0)) == Decision("eagle", "adaptive_prior")
    assert decide(policy, shared(1, 0)) == Decision("plain", "adaptive_prior")  # not a probe: EAGLE is busy
    policy.observe(completion("eagle", FIELD_EAGLE, 1))
    assert decide(policy, shared(0, 0)) == Decision("plain", "adaptive_explore")


def test_speculation_prior_fades_with_evidence() -> None:
    policy = AdaptivePolicy()
    decide(policy, snap(0, 0))
    # One short, unlucky EAGLE warm-up response (5% slower than plain) and one plain response.
    policy.observe(completion("eagle", TpotLine(6.1 * MS, 0.0), 1, tokens=16))
    policy.observe(completion("plain", TpotLine(5.82 * MS, 0.0), 1, tokens=16))
    assert steady(policy, 0, 0).backend == "eagle"  # the prior outweighs one short response
    for _ in range(5):
        policy.observe(completion("eagle", TpotLine(6.1 * MS, 0.0), 1))
    assert steady(policy, 0, 0).backend == "plain"  # real evidence outweighs the prior
    assert spec_factor(policy) > 1 - SPEC_PRIOR / 5


def test_beliefs_follow_the_live_pool() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN)
    load = {"eagle": 3, "plain": 10}
    policy.attach(lambda: snap(load["eagle"], load["plain"]))
    beliefs = policy.beliefs()
    # After 400 responses the speculation prior is below 0.1% of EAGLE's prediction.
    assert beliefs["predicted_tpot_seconds"]["eagle"] == pytest.approx(FIELD_EAGLE.at(4), rel=1e-3)
    assert beliefs["predicted_tpot_seconds"]["plain"] == pytest.approx(FIELD_PLAIN.at(11), rel=1e-3)
    assert beliefs["crossover_concurrency"] == pytest.approx(1.694, rel=1e-2)
    load["plain"] = 0
    assert policy.beliefs()["predicted_tpot_seconds"]["plain"] == pytest.approx(FIELD_PLAIN.at(1), rel=1e-3)


def test_a_decisions_predicted_tpot_is_the_fit_at_the_load_it_read() -> None:
    policy = trained(FIELD_EAGLE, FIELD_PLAIN)
    assert policy.predicted_tpot(snap(3, 10), "eagle") == pytest.approx(FIELD_EAGLE.at(4), rel=1e-3)
    assert policy.predicted_tpot(snap(3, 10), "plain") == pytest.approx(FIELD_PLAIN.at(11), rel=1e-3)
    assert AdaptivePolicy().predicted_tpot(snap(0, 0), "eagle") is None  # nothing learned: no prediction


def test_responses_without_decode_time_teach_nothing() -> None:
    policy = AdaptivePolicy()
    decide(policy, snap(0, 0))
    policy.observe(Completion("eagle", 1, 0.01, 0.0, 1.0, 1.0))
    policy.observe(Completion("eagle", 5, 0.01, 0.0, 1.0, 1.0))
    assert policy.beliefs()["backends"]["eagle"]["observations"] == 0


def test_configured_through_the_policy_table() -> None:
    policy = make_policy(
        PolicyConfig(
            name="adaptive", adaptive_eagle_cap=64, adaptive_slo_tpot_ms=25, adaptive_probe_every=7, adaptive_colocated=True
        )
    )
    assert isinstance(policy, AdaptivePolicy)
    described = policy.describe()
    assert described["eagle_cap"] == 64
    assert described["slo_tpot_seconds"] == pytest.approx(0.025)
    assert described["probe_every"] == 7 and described["colocated"] is True
    assert make_policy(PolicyConfig(name="adaptive")).describe()["eagle_cap"] == 128


@pytest.mark.parametrize("kwargs", [{"eagle_cap": 0}, {"probe_every": 0}, {"slo_tpot": 0.0}])
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdaptivePolicy(**kwargs)  # type: ignore[arg-type]


def test_a_streams_progress_teaches_the_curve_before_it_ends() -> None:
    policy = AdaptivePolicy(colocated=True)
    decide(policy, shared(0, 0))  # learns which backend is which
    # EAGLE's chunks carry several tokens: until a completion says how many, its stretches are not read.
    policy.paced(Progress("eagle", 0.08, 8, 4.0, 4.0))
    assert policy.beliefs()["backends"]["eagle"]["observations"] == 0
    policy.observe(Completion("eagle", 30, 0.02, 0.2, 1.0, 1.0, token_chunks=10))  # 30 tokens in 10 chunks: tau 3
    # Eight steps at four in flight, 24 tokens in 0.24 s: 10 ms per token at 4.
    policy.paced(Progress("eagle", 0.24, 8, 4.0, 4.0))
    assert curve_at(policy, "eagle", 4) == pytest.approx(0.010)
    # A stretch decoded beside the other server's requests is not this server's own pace.
    before = policy.beliefs()["backends"]["eagle"]["observations"]
    policy.paced(Progress("eagle", 0.5, 8, 4.0, 7.0))
    assert policy.beliefs()["backends"]["eagle"]["observations"] == before
    # Plain decode streams a token per chunk: its stretches count from the first.
    policy.paced(Progress("plain", 0.06, 8, 3.0, 3.0))
    assert curve_at(policy, "plain", 3) == pytest.approx(0.06 / 8)
