"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.testbed import SimFactory


@pytest.fixture
def sims() -> Iterator[SimFactory]:
    """Start simulators inside one test; every one is stopped at its end, pass or fail."""
    with SimFactory() as factory:
        yield factory
