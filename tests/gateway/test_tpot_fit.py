"""The online TPOT(n) curve on synthetic decode timelines with known parameters.

Each synthetic response is built step by step from calibration.md's model: a step with B running
requests takes t0 + a*B (plus jitter), yields 1 + Binomial(K-1, p) tokens per request under
speculation, and now and then carries another request's prefill (a spike) or a stall (an
outlier). The observation is what the gateway sees: mean in-flight while decoding and decode
seconds per token. The truth is TPOT(n) = (t0 + a*n) / tau.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from gateway.policies.adaptive.fit import (
    EstimatorConfig,
    TpotEstimator,
    TpotLine,
    band_of,
)


@dataclass(frozen=True)
class StepModel:
    t0: float  # seconds
    a: float  # seconds per running request
    tau: float = 1.0
    draft: int = 1  # most tokens per step

    @property
    def truth(self) -> TpotLine:
        return TpotLine(self.t0 / self.tau, self.a / self.tau)


@dataclass(frozen=True)
class Noise:
    jitter: float = 0.03  # relative sd of each step's time
    spike_rate: float = 0.08  # chance a long prompt's prefill lands in a response's decode window ...
    spike_size: tuple[float, float] = (0.3, 3.0)  # ... adding this share of its decode time (uniform)
    outlier_rate: float = 0.0  # chance a response's decode time is multiplied by `outlier_factor`
    outlier_factor: float = 6.0


def response(rng: random.Random, model: StepModel, noise: Noise, n: int, tokens: int) -> tuple[float, float]:
    """(mean in-flight while decoding, decode seconds per token) of one synthetic response."""
    p = (model.tau - 1.0) / (model.draft - 1) if model.draft > 1 else 0.0
    elapsed = area = 0.0
    got = 0
    while got < tokens - 1:
        batch = n + rng.choice((-1, 0, 0, 1)) if n >= 8 else n  # others come and go around the level
        step = (model.t0 + model.a * batch) * max(0.2, rng.gauss(1.0, noise.jitter))
        elapsed += step
        area += batch * step
        got += 1 + sum(rng.random() < p for _ in range(model.draft - 1))
    if rng.random() < noise.spike_rate:
        spike = rng.uniform(*noise.spike_size) * elapsed
        elapsed += spike
        area += n * spike
    if rng.random() < noise.outlier_rate:  # a stall: the requests in flight stay in flight through it
        stall = (noise.outlier_factor - 1.0) * elapsed
        elapsed += stall
        area += n * stall
    return area / elapsed, elapsed / (tokens - 1)


def traffic(rng: random.Random, model: StepModel, noise: Noise, count: int, levels: range, hold: int = 20):
    """`count` responses whose load level changes every `hold` responses."""
    level = rng.choice(levels)
    for i in range(count):
        if i % hold == 0:
            level = rng.choice(levels)
        yield response(rng, model, noise, level, rng.randint(64, 256)), 0


def feed(
    est: TpotEstimator, rng: random.Random, model: StepModel, noise: Noise, count: int, levels: range, hold: int = 20
) -> None:
    for (n, tpot), _ in traffic(rng, model, noise, count, levels, hold):
        est.observe(n, tpot, tokens=127)


def predicts(est: TpotEstimator, truth: TpotLine, levels: range, tolerance: float) -> bool:
    """TPOT(n) within `tolerance` at every n in `levels`: what routing relies on."""
    return all(abs(est.predict(n) / truth.at(n) - 1) <= tolerance for n in levels)


def misses(est: TpotEstimator, truth: TpotLine, levels: range) -> float:
    """The worst relative error over `levels`."""
    return max(abs(est.predict(n) / truth.at(n) - 1) for n in levels)


# The two built-in profiles' roles (calibration.md), in seconds.
FIELD_EAGLE = StepModel(5.82e-3, 8.47e-3, tau=3.0, draft=4)
FIELD_PLAIN = StepModel(4.53e-3, 1.294e-3)
LLAMA_EAGLE = StepModel(10.71e-3, 0.149e-3, tau=2.9, draft=4)
LLAMA_PLAIN = StepModel(6.27e-3, 0.045e-3)


@pytest.mark.parametrize(
    ("model", "levels"),
    [(FIELD_EAGLE, range(1, 41)), (FIELD_PLAIN, range(1, 129)), (LLAMA_EAGLE, range(1, 129)), (LLAMA_PLAIN, range(1, 129))],
    ids=["field-eagle", "field-plain", "llama-eagle", "llama-plain"],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recovers_known_curves_through_noise_spikes_and_outliers(model: StepModel, levels: range, seed: int) -> None:
    rng = random.Random(seed)
    est = TpotEstimator()
    feed(est, rng, model, Noise(outlier_rate=0.03), 1500, levels)
    assert predicts(est, model.truth, range(levels.start + 1, levels.stop), 0.10), misses(est, model.truth, levels)


def test_robustness_is_what_keeps_it_within_ten_percent() -> None:
    """On the same data the mean of each band (the bands' latest responses, unweighted by rank) is
    thrown off by the spikes and stalls; the estimator's medians are not."""
    rng = random.Random(7)
    noise = Noise(spike_rate=0.12, outlier_rate=0.04)
    points = [p for p, _ in traffic(rng, FIELD_EAGLE, noise, 1500, range(1, 41))]
    est = TpotEstimator()
    for n, tpot in points:
        est.observe(n, tpot, tokens=127)
    levels = range(2, 41)
    assert predicts(est, FIELD_EAGLE.truth, levels, 0.10), misses(est, FIELD_EAGLE.truth, levels)
    bands: dict[int, list[tuple[float, float]]] = {}
    for n, tpot in points:
        bands.setdefault(band_of(n), []).append((n, tpot))
    means = {i: sum(y for _, y in ps[-32:]) / len(ps[-32:]) for i, ps in bands.items()}
    assert max(abs(means[band_of(n)] / FIELD_EAGLE.truth.at(n) - 1) for n in levels if band_of(n) in means) > 0.10


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_adapts_within_tens_of_responses_when_acceptance_drops(seed: int) -> None:
    rng = random.Random(seed)
    est = TpotEstimator()
    feed(est, rng, FIELD_EAGLE, Noise(), 800, range(1, 41), hold=5)
    assert predicts(est, FIELD_EAGLE.truth, range(2, 41), 0.10)
    worse = StepModel(FIELD_EAGLE.t0, FIELD_EAGLE.a, tau=2.0, draft=4)  # TPOT up 50% at every load
    feed(est, rng, worse, Noise(), 60, range(1, 41), hold=5)
    assert est.relearns >= 1
    feed(est, rng, worse, Noise(), 60, range(1, 41), hold=5)
    assert predicts(est, worse.truth, range(2, 41), 0.10), misses(est, worse.truth, range(2, 41))


@pytest.mark.parametrize("factor", [1.4, 0.7])
def test_responses_off_at_one_load_move_the_curve_near_it_only(factor: float) -> None:
    """Responses off by the same margin at one load only (steps crowded with prefills while a burst
    lands, all of them shared by the requests decoding then) are news about the curve there, not a
    changed backend: the curve there follows them as far as it stays non-decreasing (the loads just
    above a rise, or just below a dip, move with it) and elsewhere keeps its level."""
    rng = random.Random(21)
    est = TpotEstimator()
    feed(est, rng, LLAMA_EAGLE, Noise(), 800, range(1, 65), hold=5)
    assert predicts(est, LLAMA_EAGLE.truth, range(2, 65), 0.10)
    for _ in range(200):
        n, tpot = response(rng, LLAMA_EAGLE, Noise(), 32, 128)
        est.observe(n, tpot * factor, tokens=127)
    assert est.relearns == 0
    moved = est.predict(32) / LLAMA_EAGLE.truth.at(32)
    assert (moved > 1.2) if factor > 1.0 else (moved < 0.85)
    assert predicts(est, LLAMA_EAGLE.truth, range(2, 9), 0.10), misses(est, LLAMA_EAGLE.truth, range(2, 9))
    assert est.predict(64) == pytest.approx(LLAMA_EAGLE.truth.at(64), rel=0.10)
    curve = [est.predict(n) for n in range(1, 80)]
    assert curve == sorted(curve)


def test_a_load_that_reads_slow_never_makes_a_busier_server_look_faster() -> None:
    """A burst's short answers at one load decode while the rest of it prefills and read slow: the curve
    rises there and stays at least as high above it, so of two servers alike the busier one is never
    predicted faster (a dip sent every request of a high-rate level to one of two plain groups)."""
    rng = random.Random(8)
    est = TpotEstimator()
    feed(est, rng, LLAMA_PLAIN, Noise(), 800, range(1, 129), hold=5)
    for _ in range(60):
        n, tpot = response(rng, LLAMA_PLAIN, Noise(), 64, 128)
        est.observe(n, tpot * 1.3, tokens=127)
    assert est.predict(65) > LLAMA_PLAIN.truth.at(65) * 1.1
    assert est.predict(99) >= est.predict(65)


def test_a_faster_backend_is_also_picked_up() -> None:
    """The same for an improvement (e.g. a restart with a better draft model): TPOT down a third."""
    rng = random.Random(5)
    est = TpotEstimator()
    feed(est, rng, LLAMA_EAGLE, Noise(), 800, range(1, 129), hold=5)
    better = StepModel(LLAMA_EAGLE.t0 * 0.8, LLAMA_EAGLE.a * 0.8, tau=3.5, draft=4)
    feed(est, rng, better, Noise(), 120, range(1, 129), hold=5)
    assert predicts(est, better.truth, range(2, 129), 0.10), misses(est, better.truth, range(2, 129))


def test_without_change_detection_it_would_stay_wrong() -> None:
    """The change detector, not the slow half-life, is what makes re-learning fast."""
    rng = random.Random(11)
    slow = TpotEstimator(EstimatorConfig(shift_size=10.0))  # change detection off
    feed(slow, rng, FIELD_EAGLE, Noise(), 800, range(1, 41), hold=5)
    worse = StepModel(FIELD_EAGLE.t0, FIELD_EAGLE.a, tau=2.0, draft=4)
    feed(slow, rng, worse, Noise(), 120, range(1, 41), hold=5)
    assert slow.relearns == 0
    assert not predicts(slow, worse.truth, range(2, 41), 0.10)


def test_noise_alone_does_not_trigger_relearning() -> None:
    rng = random.Random(3)
    est = TpotEstimator()
    feed(est, rng, FIELD_EAGLE, Noise(spike_rate=0.12, outlier_rate=0.04), 300, range(1, 41))
    settled = est.relearns  # the first bands from a handful of points may be re-done
    feed(est, rng, FIELD_EAGLE, Noise(spike_rate=0.12, outlier_rate=0.04), 3000, range(1, 41))
    assert est.relearns == settled


def test_a_single_load_level_predicts_that_level_and_extrapolates_at_the_prior_slope() -> None:
    """No spread in n: the level from the data, the slope from the weak prior, measured only where seen."""
    rng = random.Random(4)
    est = TpotEstimator()
    for _ in range(300):
        n, tpot = response(rng, LLAMA_PLAIN, Noise(spike_rate=0.0), 6, 128)
        est.observe(n, tpot, tokens=127)
    level = est.predict(6)
    assert level == pytest.approx(LLAMA_PLAIN.truth.at(6), rel=0.03)
    slope = (est.predict(16) - level) / 10
    assert slope == pytest.approx(0.1 * level / (1 + 0.1 * 6), rel=0.05)  # the prior's shape through the point
    assert est.curve is not None and est.curve.reach == pytest.approx(6.0, abs=0.5)


def test_spread_overrides_the_prior_slope() -> None:
    """Two load levels pin the slope, however far it is from the prior's 0.1 per request."""
    est = TpotEstimator()
    truth = TpotLine(2e-3, 3e-3)  # slope 1.5x the intercept, 15x the prior's ratio
    for i in range(200):
        n = 2.0 if i % 2 else 10.0
        est.observe(n, truth.at(n), tokens=127)
    assert predicts(est, truth, range(2, 30), 0.02)


def test_far_prior_keeps_a_light_stretch_from_pricing_heavy_loads() -> None:
    """Plain decode measured only at one and two requests, a few of them slowed by prefills: its slope
    holds up to twice those loads, and past them the prior's gentler one takes over (with `far_prior`);
    without it, the stretch's slope is carried to any load."""
    responses = [(1.0, 5.9e-3)] * 12 + [(1.25, 7.0e-3)] * 4 + [(1.9, 15e-3)] * 4 + [(2.0, 8.6e-3)] * 12
    plain = TpotEstimator(EstimatorConfig(prior_slope_ratio=0.01, far_prior=True))
    steep = TpotEstimator(EstimatorConfig(prior_slope_ratio=0.01))
    for n, tpot in responses:
        plain.observe(n, tpot, tokens=127)
        steep.observe(n, tpot, tokens=127)
    assert plain.predict(3.0) == pytest.approx(steep.predict(3.0))  # within twice the reach: as measured
    top = plain.predict(4.0)
    assert steep.predict(4.0) == pytest.approx(top)
    prior = 0.01 * plain.predict(2.0) / (1 + 0.01 * 2.0)
    assert plain.predict(16.0) == pytest.approx(top + 12 * prior)
    assert steep.predict(16.0) > 3 * plain.predict(16.0)  # the stretch's slope, carried eight-fold


def test_a_bent_curve_is_followed_where_it_was_measured() -> None:
    """A step table flat at light load and steep at heavy load (a compute-bound batch): a line through
    it misses both ends, the bands follow it."""
    table = {n: 5e-3 * (1 + max(0, n - 32) / 16) for n in range(1, 129)}
    est = TpotEstimator()
    for i in range(2000):
        n = 1 + (i * 37) % 128
        est.observe(float(n), table[n], tokens=127)
    assert all(abs(est.predict(n) / table[n] - 1) <= 0.06 for n in (2, 8, 24, 48, 64, 96, 120))


def test_short_responses_count_less() -> None:
    est = TpotEstimator()
    for _ in range(20):
        est.observe(4.0, 0.010, tokens=127)
    est.observe(4.0, 0.020, tokens=4)  # a 5-token response that happened to be slow
    assert est.predict(4.0) == pytest.approx(0.010, rel=0.02)


def test_invalid_points_are_ignored() -> None:
    est = TpotEstimator()
    for n, tpot in ((1.0, 0.0), (1.0, -1.0), (1.0, math.nan), (math.inf, 0.01), (-1.0, 0.01)):
        est.observe(n, tpot, tokens=10)
    assert not est.fitted and est.observations == 0


def test_forget_keeps_the_curve_but_lets_new_data_win() -> None:
    est = TpotEstimator()
    for i in range(300):
        est.observe(float(1 + i % 8), 0.004 + 0.001 * (1 + i % 8), tokens=127)
    est.forget(0.0)
    assert est.fitted and est.predict(4) == pytest.approx(0.008, rel=0.05)
    for i in range(8):
        est.observe(float(1 + i % 4), 0.010 + 0.002 * (1 + i % 4), tokens=127)
    assert est.predict(2) == pytest.approx(0.014, rel=0.05)


def test_a_new_load_is_news_not_an_outlier() -> None:
    """Near-deterministic data at one load leaves a tight residual scale and a slope made by the
    prior; the first points at another load are far off that slope and must teach it."""
    est = TpotEstimator()
    truth = TpotLine(1e-3, 1.4e-3)  # slope 14x the prior's ratio (field-8gpu's EAGLE shape)
    for _ in range(40):
        est.observe(1.0, truth.at(1), tokens=127)
    assert est.predict(4) < 0.5 * truth.at(4)
    for _ in range(3):
        est.observe(4.0, truth.at(4), tokens=127)
    assert est.predict(4) == pytest.approx(truth.at(4), rel=0.1)
    assert est.predict(3) == pytest.approx(truth.at(3), rel=0.1)
