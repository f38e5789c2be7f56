"""Fixtures of the deploy checks: the repository, and a copy of its deploy files to break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """deploy/ plus the files the image build reads, copied to a tmp dir where a test may break them."""
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "hatch_build.py"):
        shutil.copy(REPO / name, tmp_path / name)
    for package in ("specgate", "gateway", "backends", "loadtest", "tokencount"):
        (tmp_path / package).mkdir()
    return tmp_path
