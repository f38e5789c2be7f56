"""Fixtures of the reliability suite: simulated backends started per test and always stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.testbed import SimFactory


@pytest.fixture
def sims() -> Iterator[SimFactory]:
    """Start sims inside one test; every one is stopped at its end, pass or fail."""
    factory = SimFactory()
    try:
        yield factory
    finally:
        factory.close()
