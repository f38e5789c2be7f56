"""Fixtures shared by every test package."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from backends.testbed import SimFactory

# Marked suites that time things or start many processes of their own: asked for, they run in one process
# whatever `-n` (pyproject's addopts) says.
ONE_PROCESS_MARKERS = ("simtiming", "reliability", "family", "calibrate", "image", "smg", "prometheus", "deploy", "sglang")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """A marker expression selecting one of ONE_PROCESS_MARKERS (not just excluding it) turns pytest-xdist off."""
    expr = config.getoption("markexpr") or ""
    if any(re.search(rf"(?<!not )\b{marker}\b", expr) for marker in ONE_PROCESS_MARKERS):
        config.option.numprocesses, config.option.dist, config.option.tx = 0, "no", []


@pytest.fixture
def sims() -> Iterator[SimFactory]:
    """Start simulators inside one test; every one is stopped at its end, pass or fail."""
    with SimFactory() as factory:
        yield factory
