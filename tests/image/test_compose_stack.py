"""deploy/docker-compose.yml's sim profile, run by Docker Compose v2 against podman's Docker-compatible API.

The repository's compose file runs as it is, with one override file for what this machine lacks: no
registry, so the gateway uses the image the session built and Prometheus runs from the Debian base
with Debian's prometheus binary mounted in (prom/prometheus cannot be pulled); the published ports
move to free loopback ports. Grafana (grafana/grafana, not pullable either) is not started. Prometheus
scrapes the gateway and both simulated servers over the compose network by the service alias
`specgate`, with the repository's scrape config and alert rules.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from backends.process import free_loopback_port
from tests.deploy.prometheus_run import answers, assert_node_scraped, child, wait_until
from tests.deploy.tools import compose_binary, find_tool
from tests.image.podman import Built, inspect

# The first test also waits for the image build (pip downloads): it may need more than the default 120 s.
pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

COMPOSE = "deploy/docker-compose.yml"
HI = [{"role": "user", "content": "hi"}]
# podman's defaults for the containers the API creates: the same runtime and ulimits as tests/image/podman.py.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
"""


@pytest.fixture
def docker_host(tmp_path: Path) -> Iterator[str]:
    """`podman system service` on a socket of its own, configured by CONTAINERS_CONF."""
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    socket = tmp_path / "podman.sock"
    argv = [find_tool("podman"), "system", "service", "--time=0", f"unix://{socket}"]
    with child(argv, tmp_path / "podman-service.log", {"CONTAINERS_CONF": str(conf)}) as proc:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=5) as api:

            def pong() -> bool:
                try:
                    return api.get("http://podman/_ping").text == "OK"
                except httpx.TransportError:
                    return False

            wait_until(pong, "podman's Docker API", 30, proc)
        yield f"unix://{socket}"


def _override(gateway_image: str, base_image: str, ports: dict[str, int]) -> dict:
    return {
        "services": {
            "specgate-sim": {
                "image": gateway_image,
                "pull_policy": "never",
                "ports": [f"127.0.0.1:{ports['gateway']}:8000"],
            },
            "prometheus": {
                "image": base_image,
                "pull_policy": "never",
                "entrypoint": ["/usr/local/bin/prometheus"],
                "volumes": [f"{find_tool('prometheus')}:/usr/local/bin/prometheus:ro"],
                "ports": [f"127.0.0.1:{ports['prometheus']}:9090"],
            },
        }
    }


def test_sim_profile_serves_and_prometheus_scrapes_it(
    docker_host: str, gateway_image: Built, base_image: str, repo: Path, tmp_path: Path
) -> None:
    ports = {"gateway": free_loopback_port(), "prometheus": free_loopback_port()}
    override = tmp_path / "override.yml"
    # `!override` replaces the compose file's port lists instead of adding to them.
    text = yaml.safe_dump(_override(gateway_image.tag, base_image, ports))
    override.write_text(text.replace("ports:\n", "ports: !override\n"))
    project = f"specgate-ci-{os.getpid()}"
    compose = [compose_binary(), "-f", str(repo / COMPOSE), "-f", str(override), "-p", project, "--profile", "sim"]
    env = {**os.environ, "DOCKER_HOST": docker_host}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*compose, *args], env=env, capture_output=True, text=True, timeout=180, check=False)
        assert result.returncode == 0, f"compose {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result

    try:
        run("up", "--detach", "specgate-sim", "prometheus")
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        wait_until(lambda: answers(f"{gateway}/ready"), "the compose gateway /ready", 90)
        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)
        for _ in range(3):
            client.chat.completions.create(model="sim-model", messages=HI, max_tokens=8)
        prom = f"http://127.0.0.1:{ports['prometheus']}"
        wait_until(lambda: answers(f"{prom}/-/ready"), "the compose Prometheus", 60)
        assert_node_scraped(repo, prom, None, requests=3)

        # `docker compose stop` sends SIGTERM and waits stop_grace_period: the gateway stops itself, exit 0.
        run("stop", "specgate-sim")
        state = inspect("container", f"{project}-specgate-sim-1")["State"]
        assert state["ExitCode"] == 0, state
    finally:
        down = [*compose, "down", "--volumes", "--timeout=10"]
        subprocess.run(down, env=env, capture_output=True, timeout=180, check=False)
