"""The online TPOT(n) fit on synthetic decode timelines with known parameters.

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

from gateway.policies.adaptive.fit import EstimatorConfig, Fit, TpotEstimator


@dataclass(frozen=True)
class StepModel:
    t0: float  # seconds
    a: float  # seconds per running request
    tau: float = 1.0
    draft: int = 1  # most tokens per step

    @property
    def truth(self) -> Fit:
        return Fit(self.t0 / self.tau, self.a / self.tau)


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
    if rng.random() < noise.outlier_rate:
        elapsed *= noise.outlier_factor
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


def within(fit: Fit | None, truth: Fit, tolerance: float) -> bool:
    assert fit is not None
    return abs(fit.alpha / truth.alpha - 1) <= tolerance and abs(fit.beta / truth.beta - 1) <= tolerance


def predicts(est: TpotEstimator, truth: Fit, levels: range, tolerance: float) -> bool:
    """TPOT(n) within `tolerance` at every n in `levels`: what routing relies on.

    After a change only tens of points exist; the intercept of a steep backend (field-8gpu's
    EAGLE: 1.9 ms against 2.8 ms per request) is then the least certain number, so re-learning is
    judged on predictions over the load range the traffic covers, and on the slope.
    """
    return all(abs(est.predict(n) / truth.at(n) - 1) <= tolerance for n in levels)


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
def test_recovers_known_parameters_through_noise_spikes_and_outliers(model: StepModel, levels: range, seed: int) -> None:
    rng = random.Random(seed)
    est = TpotEstimator()
    feed(est, rng, model, Noise(outlier_rate=0.03), 1500, levels)
    assert within(est.fit, model.truth, 0.10), (est.fit, model.truth)


def test_robustness_is_what_keeps_it_within_ten_percent() -> None:
    """On the same data an ordinary least-squares line is thrown off by the spikes and outliers."""
    rng = random.Random(7)
    noise = Noise(spike_rate=0.12, outlier_rate=0.04)
    points = [p for p, _ in traffic(rng, FIELD_EAGLE, noise, 1500, range(1, 41))]
    est = TpotEstimator()
    for n, tpot in points:
        est.observe(n, tpot, tokens=127)
    assert within(est.fit, FIELD_EAGLE.truth, 0.10)
    ols = ordinary_least_squares(points)
    assert not within(ols, FIELD_EAGLE.truth, 0.10), ols


def ordinary_least_squares(points: list[tuple[float, float]]) -> Fit:
    k = len(points)
    mx = sum(n for n, _ in points) / k
    my = sum(y for _, y in points) / k
    sxx = sum((n - mx) ** 2 for n, _ in points)
    sxy = sum((n - mx) * (y - my) for n, y in points)
    beta = sxy / sxx
    return Fit(my - beta * mx, beta)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_adapts_within_tens_of_responses_when_acceptance_drops(seed: int) -> None:
    rng = random.Random(seed)
    est = TpotEstimator()
    feed(est, rng, FIELD_EAGLE, Noise(), 800, range(1, 41), hold=5)
    assert within(est.fit, FIELD_EAGLE.truth, 0.10)
    worse = StepModel(FIELD_EAGLE.t0, FIELD_EAGLE.a, tau=2.0, draft=4)  # TPOT up 50% at every load
    feed(est, rng, worse, Noise(), 30, range(1, 41), hold=5)
    assert est.relearns >= 1
    feed(est, rng, worse, Noise(), 90, range(1, 41), hold=5)
    assert predicts(est, worse.truth, range(2, 41), 0.10), (est.fit, worse.truth)
    assert abs(est.beta / worse.truth.beta - 1) <= 0.10


def test_a_faster_backend_is_also_picked_up() -> None:
    """The same for an improvement (e.g. a restart with a better draft model): TPOT down a third."""
    rng = random.Random(5)
    est = TpotEstimator()
    feed(est, rng, LLAMA_EAGLE, Noise(), 800, range(1, 129), hold=5)
    better = StepModel(LLAMA_EAGLE.t0 * 0.8, LLAMA_EAGLE.a * 0.8, tau=3.5, draft=4)
    feed(est, rng, better, Noise(), 120, range(1, 129), hold=5)
    assert predicts(est, better.truth, range(1, 129), 0.10), (est.fit, better.truth)


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
    settled = est.relearns  # the first fits from a handful of points may be re-done
    feed(est, rng, FIELD_EAGLE, Noise(spike_rate=0.12, outlier_rate=0.04), 3000, range(1, 41))
    assert est.relearns == settled


def test_a_single_load_level_still_predicts_that_level_and_a_sane_slope() -> None:
    """No spread in n: the slope comes from the weak prior, the level from the data."""
    rng = random.Random(4)
    est = TpotEstimator()
    for _ in range(300):
        n, tpot = response(rng, LLAMA_PLAIN, Noise(spike_rate=0.0), 6, 128)
        est.observe(n, tpot, tokens=127)
    assert est.predict(6) == pytest.approx(LLAMA_PLAIN.truth.at(6), rel=0.03)
    assert est.alpha > 0 and est.beta >= 0
    assert est.beta == pytest.approx(0.1 * est.alpha, rel=0.3)  # the prior's shape


def test_spread_overrides_the_prior_slope() -> None:
    """Two load levels pin the slope, however far it is from the prior's 0.1 per request."""
    est = TpotEstimator()
    truth = Fit(2e-3, 3e-3)  # slope 1.5x the intercept, 15x the prior's ratio
    for i in range(200):
        n = 2.0 if i % 2 else 10.0
        est.observe(n, truth.at(n), tokens=127)
    assert within(est.fit, truth, 0.02)


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


def test_forget_keeps_the_line_but_lets_new_data_win() -> None:
    est = TpotEstimator()
    for i in range(300):
        est.observe(float(1 + i % 8), 0.004 + 0.001 * (1 + i % 8), tokens=127)
    est.forget(0.0)
    assert est.fitted and est.predict(4) == pytest.approx(0.008, rel=1e-3)
    for i in range(5):
        est.observe(float(1 + i % 4), 0.010 + 0.002 * (1 + i % 4), tokens=127)
    assert est.predict(2) == pytest.approx(0.014, rel=0.05)


def test_a_new_load_is_news_not_an_outlier() -> None:
    """Near-deterministic data at one load leaves a tight residual scale and a slope made by the
    prior; the first points at another load are far off that slope and must teach it."""
    est = TpotEstimator()
    truth = Fit(1e-3, 1.4e-3)  # slope 14x the prior's ratio (field-8gpu's EAGLE shape)
    for _ in range(40):
        est.observe(1.0, truth.at(1), tokens=127)
    assert est.predict(2) < 0.8 * truth.at(2)
    for _ in range(3):
        est.observe(2.0, truth.at(2), tokens=127)
    assert est.predict(2) == pytest.approx(truth.at(2), rel=0.1)
