"""GapBuffer gives the histogram exposition that observing each inter-token gap would give."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.relay import gaps as gap_module
from gateway.relay.gaps import GapBuffer

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.1, 1)


@pytest.fixture(params=["C", "Python"])
def counts_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """GapBuffer counting with the C extension's GapCounts, and as a build without it does."""
    if request.param == "Python":
        monkeypatch.setattr(gap_module, "GapCounts", None)
    return str(request.param)


def test_a_gap_buffer_counts_in_c_when_the_extension_is_built() -> None:
    assert gap_module.GapCounts is not None  # CI builds it
    series = Histogram("itl", "x", buckets=BUCKETS, registry=CollectorRegistry())
    assert isinstance(GapBuffer(series).observe.__self__, gap_module.GapCounts)  # a C call per gap, no Python frame


def test_a_gap_buffer_flushes_what_observing_each_gap_would_have_recorded(counts_in: str) -> None:
    rng = random.Random(5)
    gaps = [rng.choice((0.0, 0.001, 0.0011, 0.02, 0.5, 1.0, 7.0)) for _ in range(200)]  # on and next to the bounds
    gaps += [rng.uniform(0, 2) for _ in range(200)]
    assert len(set(gaps)) > 200
    direct, buffered = CollectorRegistry(), CollectorRegistry()
    Histogram("itl", "x", ["backend"], buckets=BUCKETS, registry=direct)
    Histogram("itl", "x", ["backend"], buckets=BUCKETS, registry=buffered)
    each = direct._names_to_collectors["itl"].labels("b")  # type: ignore[attr-defined]
    buffer = GapBuffer(buffered._names_to_collectors["itl"].labels("b"))  # type: ignore[attr-defined]
    for i, gap in enumerate(gaps):
        each.observe(gap)
        buffer.observe(gap)
        if i == 150:
            buffer.flush()  # flushing twice adds each gap once
    buffer.flush()
    buffer.flush()
    got, want = _samples(buffered), _samples(direct)
    assert got.pop("itl_sum") == pytest.approx(want.pop("itl_sum"))  # the same gaps, added in another order
    assert got == want  # every bucket and the count, exactly


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    samples = [s for family in text_string_to_metric_families(generate_latest(registry).decode()) for s in family.samples]
    return {s.name + str(sorted(s.labels.items())) if s.name != "itl_sum" else s.name: s.value
            for s in samples if not s.name.endswith("_created")}
