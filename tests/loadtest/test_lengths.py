"""Length distributions: fixed, uniform in [R*L, L], lognormal with a given mean and median."""

from __future__ import annotations

import random
import statistics

import pytest

from loadtest.workloads.lengths import MAX_FACTOR, LengthDist


def draws(dist: LengthDist, length: int, n: int = 20000, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [dist.draw(rng, length) for _ in range(n)]


def test_fixed_lengths_are_the_length() -> None:
    assert set(draws(LengthDist("fixed"), 77, 100)) == {77}


def test_uniform_lengths_cover_r_l_to_l() -> None:
    sample = draws(LengthDist("uniform", range_ratio=0.25), 200)
    assert min(sample) == 50 and max(sample) == 200
    assert statistics.mean(sample) == pytest.approx(125, rel=0.02)
    assert min(draws(LengthDist("uniform", range_ratio=0.0), 10, 500)) == 1  # bench_serving's default: [1, L]


@pytest.mark.parametrize("median_ratio", [0.5, 0.8])
def test_lognormal_lengths_have_the_mean_and_the_median_asked_for(median_ratio: float) -> None:
    sample = draws(LengthDist("lognormal", median_ratio=median_ratio), 1000, n=40000)
    assert statistics.mean(sample) == pytest.approx(1000, rel=0.03)
    assert statistics.median(sample) == pytest.approx(1000 * median_ratio, rel=0.03)
    assert min(sample) >= 1 and max(sample) <= MAX_FACTOR * 1000


def test_lognormal_lengths_are_clipped_to_one_and_to_the_factor() -> None:
    sample = draws(LengthDist("lognormal", median_ratio=0.01), 2, n=5000)
    assert min(sample) == 1 and max(sample) == MAX_FACTOR * 2


def test_draws_are_reproducible_from_the_seed() -> None:
    dist = LengthDist("lognormal")
    assert draws(dist, 300, 50, seed=9) == draws(dist, 300, 50, seed=9) != draws(dist, 300, 50, seed=10)


def test_options_choose_the_distribution_as_the_range_ratio_always_did() -> None:
    assert LengthDist.of(None, 1.0) == LengthDist("fixed")
    assert LengthDist.of(None, 0.5) == LengthDist("uniform", 0.5)
    assert LengthDist.of("lognormal", 1.0, 0.3) == LengthDist("lognormal", 1.0, 0.3)
    with pytest.raises(ValueError, match="range ratio below 1"):
        LengthDist.of("lognormal", 0.5)
    for bad in ({"kind": "normal"}, {"range_ratio": 1.5}, {"median_ratio": 0.0}, {"median_ratio": 1.2}):
        with pytest.raises(ValueError):
            LengthDist(**bad)  # type: ignore[arg-type]
