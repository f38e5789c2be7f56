"""Fixtures of the image checks: the base image, the gateway-only image built once per session, a summary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.image.podman import Built, build

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASE = "localhost/specgate-python:trixie"
BUILT = pytest.StashKey[list[Built]]()


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def base_image() -> str:
    """The Python base image .ci/image-tools.sh made (the Dockerfile's PYTHON_IMAGE cannot be pulled here)."""
    tag = os.environ.get("SPECGATE_IMAGE_BASE", DEFAULT_BASE)
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode != 0:
        pytest.fail(f"no base image {tag}; run .ci/image-tools.sh first")
    return tag


@pytest.fixture(scope="session")
def gateway_image(request: pytest.FixtureRequest, base_image: str) -> Built:
    """The `gateway-only` target, built from the repository as it is."""
    built = build(REPO, "gateway-only", "localhost/specgate-gateway:ci", {"PYTHON_IMAGE": base_image})
    request.config.stash.setdefault(BUILT, []).append(built)
    return built


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """What was built, how long it took and how large it is, so CI's log records it."""
    for built in config.stash.get(BUILT, []):
        size = f"{built.size_bytes / 1e6:.0f} MB"
        terminalreporter.write_line(f"image {built.tag} (target {built.target}): {size}, built in {built.seconds:.0f} s")
