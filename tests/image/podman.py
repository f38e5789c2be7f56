"""Podman, driven from the image checks: build a target, run a container with published ports, inspect it.

Every container runs under runc with explicit ulimits, the two quirks of these machines that
.ci/image-tools.sh describes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.process import free_loopback_port

RUNTIME = ["--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
# The host's CA bundle, mounted into the build's RUN steps so pip trusts this network's TLS proxy.
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
SIM_CONFIG = "deploy/compose/specgate-sim.toml"
# Where deploy/compose/specgate-sim.toml puts the gateway and the two simulated SGLang servers.
CONTAINER_PORTS = {"gateway": 8000, "eagle": 30001, "plain": 30002}


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run podman to completion; fail the test with its output if it fails."""
    binary = shutil.which("podman")
    if binary is None:
        pytest.fail("podman is not installed; run .ci/image-tools.sh first")
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@dataclass(frozen=True)
class Built:
    """An image built from the repository's Dockerfile."""

    tag: str
    target: str
    seconds: float
    size_bytes: int


def build(repo: Path, target: str, tag: str, build_args: dict[str, str]) -> Built:
    """`podman build --target TARGET` of the repository, in Docker's format so HEALTHCHECK is kept."""
    args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
    ca = [f"--volume={HOST_CA}:{HOST_CA}:ro"] if os.path.isfile(HOST_CA) else []
    started = time.monotonic()
    podman(
        "build", *RUNTIME, "--network=host", "--pull=never", "--format=docker", *ca, *args,
        f"--target={target}", f"--tag={tag}", str(repo),
        timeout=600,
    )  # fmt: skip
    seconds = time.monotonic() - started
    return Built(tag, target, seconds, int(podman("image", "inspect", "--format={{.Size}}", tag).stdout))


def inspect(kind: str, name: str) -> dict[str, Any]:
    """`podman KIND inspect NAME` as a dict (KIND: image or container)."""
    return json.loads(podman(kind, "inspect", name).stdout)[0]


@dataclass(frozen=True)
class Container:
    """A running container and the loopback URLs of its published ports, by CONTAINER_PORTS' names."""

    name: str
    urls: dict[str, str]

    def as_compose_targets(self) -> dict[str, str]:
        """Where the compose network's `specgate:PORT` targets are published on the host."""
        return {f"specgate:{port}": self.urls[role].removeprefix("http://") for role, port in CONTAINER_PORTS.items()}


def _unique_name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


@contextmanager
def running(image: str, repo: Path, logs: Path, env: Mapping[str, str] | None = None) -> Iterator[Container]:
    """The image serving deploy/compose/specgate-sim.toml (`env`: settings over it, as SPECGATE_* variables),
    each port published on a free loopback port.

    Removed on exit whatever state it is in; its log is copied to `logs` first.
    """
    name = _unique_name("specgate-ci")
    ports = {role: free_loopback_port() for role in CONTAINER_PORTS}
    publish = [f"--publish=127.0.0.1:{ports[role]}:{port}" for role, port in CONTAINER_PORTS.items()]
    variables = [f"--env={key}={value}" for key, value in (env or {}).items()]
    try:
        podman(
            "run", "--detach", f"--name={name}", *RUNTIME, *ULIMITS, *publish, *variables,
            f"--volume={repo / SIM_CONFIG}:/etc/specgate/specgate.toml:ro", image,
        )  # fmt: skip
        yield Container(name, {role: f"http://127.0.0.1:{port}" for role, port in ports.items()})
    finally:
        log = subprocess.run(["podman", "logs", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        logs.write_bytes(log.stdout)
        subprocess.run(["podman", "rm", "--force", "--time=5", name], capture_output=True, check=False, timeout=60)


def run_once(image: str, *command: str, entrypoint: str | None = None, user: str | None = None) -> str:
    """Output of a one-off command in a fresh container of `image` (no network)."""
    override = [f"--entrypoint={entrypoint}"] if entrypoint else []
    override += [f"--user={user}"] if user else []
    return podman("run", "--rm", *RUNTIME, *ULIMITS, "--network=none", *override, image, *command).stdout
