"""The Dockerfile: image contract (targets, base image, non-root, health check, entrypoint) and hadolint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.deploy_checks import dockerfile_problems, dockerfile_stages
from tests.deploy.tools import find_tool, run_tool


def test_dockerfile_meets_the_image_contract(repo: Path) -> None:
    assert dockerfile_problems(repo / "Dockerfile", repo / ".dockerignore") == []
    assert dockerfile_stages(repo / "Dockerfile")[-1] == "runtime"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("USER 10001:0\nEXPOSE 8000\n# Loading", "USER root\nEXPOSE 8000\n# Loading", "runtime: does not switch to a non-root USER"),
        ("v0.5.23-cu130-runtime", "v0.5.22-cu129", "lmsysorg/sglang v0.5.23 with CUDA 13"),
        ('"--config", "/etc/specgate/specgate.toml"]\nCMD []\n\n#', '"--config", "/etc/specgate.toml"]\nCMD []\n\n#', "gateway-only: ENTRYPOINT must be"),
        ("127.0.0.1:8000/health', timeout=4)\"]\nENTRYPOINT", "127.0.0.1:8000/ready', timeout=4)\"]\nENTRYPOINT", "no HEALTHCHECK on /health"),
        ("AS gateway-only", "AS gateway", "no `gateway-only` stage"),
    ],
)
def test_contract_check_fails_on_broken_dockerfile(deploy_copy: Path, old: str, new: str, expected: str) -> None:
    dockerfile = deploy_copy / "Dockerfile"
    text = dockerfile.read_text()
    assert old in text
    dockerfile.write_text(text.replace(old, new, 1))
    problems = dockerfile_problems(dockerfile, deploy_copy / ".dockerignore")
    assert any(expected in p for p in problems), problems


def test_contract_check_fails_when_dockerignore_drops_a_build_input(deploy_copy: Path) -> None:
    ignore = deploy_copy / ".dockerignore"
    ignore.write_text(ignore.read_text().replace("!loadtest\n", ""))
    problems = dockerfile_problems(deploy_copy / "Dockerfile", ignore)
    assert problems == ["COPY source loadtest is excluded by .dockerignore"]


@pytest.mark.deploy
def test_hadolint_passes(repo: Path) -> None:
    result = run_tool(find_tool("hadolint"), str(repo / "Dockerfile"))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.deploy
def test_hadolint_fails_on_broken_copy(deploy_copy: Path) -> None:
    dockerfile = deploy_copy / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("WORKDIR /src\n", "WORKDIR /src\nRUN apt-get install -y curl\n", 1))
    result = run_tool(find_tool("hadolint"), str(dockerfile))
    assert result.returncode != 0
    assert "DL3008" in result.stdout  # apt packages without pinned versions
