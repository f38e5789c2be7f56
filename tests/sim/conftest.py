"""Fixtures for the simulator's tests: sims run as child processes, as the gateway runs them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.testbed import SimFactory, SimHandle


@pytest.fixture(scope="module")
def module_sims() -> Iterator[SimFactory]:
    """Sims shared by the tests of one module."""
    with SimFactory() as factory:
        yield factory


@pytest.fixture(scope="module")
def eagle(module_sims: SimFactory) -> SimHandle:
    """An EAGLE sim, 10x fast, with metrics and the test-only routes."""
    return module_sims.start(
        "--role",
        "eagle",
        "--time-scale",
        "0.1",
        "--enable-metrics",
        "--enable-test-endpoints",
        "--extra-metric-labels",
        '{"pool":"spec"}',
    )
