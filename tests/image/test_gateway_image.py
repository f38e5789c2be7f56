"""The `gateway-only` image, built with podman and run with published ports, checked from outside.

The container serves deploy/compose/specgate-sim.toml (the compose stack's sim profile): the gateway
on 8000 and two simulated SGLang servers on 30001 and 30002, each port published on a loopback port.
"""

from __future__ import annotations

import json
import re
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.deploy.prometheus_run import (
    answers,
    assert_node_scraped,
    point_config_at,
    running_prometheus,
    wait_until,
)
from tests.image.podman import Built, Container, inspect, podman, run_once, running

# The first test also waits for the image build (pip downloads): it may need more than the default 120 s.
pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

UID = 10001
# The load tester's and the tests' packages: none belongs in the image.
NOT_IN_IMAGE = {"matplotlib", "numpy", "psutil", "tomli-w", "pytest", "pytest-asyncio", "pytest-xdist", "schemathesis", "openai"}
# Base (a Debian trixie root file system with Python's headers, 250 MB) plus specgate's venv; grows only if something heavy sneaks in.
MAX_SIZE_BYTES = 350e6
HI = [{"role": "user", "content": "hi"}]


def _client(container: Container) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{container.urls['gateway']}/v1", api_key="unused", max_retries=0, timeout=60)


def _ready(container: Container) -> None:
    wait_until(lambda: answers(f"{container.urls['gateway']}/ready"), f"{container.name} /ready", 90)


@pytest.fixture(scope="module")
def serving(gateway_image: Built, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    """One container of the image for the checks that leave it running."""
    logs = tmp_path_factory.mktemp("serving") / "container.log"
    with running(gateway_image.tag, repo, logs) as container:
        _ready(container)
        yield container


def test_openai_sdk_through_the_published_port(serving: Container) -> None:
    client = _client(serving)
    assert [m.id for m in client.models.list().data] == ["sim-model"]
    reply = client.chat.completions.create(model="sim-model", messages=HI, max_tokens=8)
    assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens == 8
    stream = client.chat.completions.create(model="sim-model", messages=HI, max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_prometheus_scrapes_the_container(serving: Container, repo: Path, tmp_path: Path) -> None:
    config = point_config_at(repo, tmp_path, serving.as_compose_targets())
    before = _requests_served(serving)
    with running_prometheus(config, tmp_path) as (prom, proc):
        for _ in range(3):
            _client(serving).chat.completions.create(model="sim-model", messages=HI, max_tokens=8)
        assert_node_scraped(repo, prom, proc, requests=before + 3)


def _requests_served(container: Container) -> int:
    """specgate_requests_total summed over its series, read straight from the gateway's /metrics."""
    text = httpx.get(f"{container.urls['gateway']}/metrics", timeout=10).text
    samples = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("specgate_requests_total{")]
    return int(sum(float(s) for s in samples))


def test_runs_as_the_non_root_user(serving: Container, gateway_image: Built) -> None:
    assert inspect("image", gateway_image.tag)["Config"]["User"] == f"{UID}:0"
    # Every process of the container (the gateway and both simulated servers), as the host sees them.
    top = podman("top", serving.name, "huser", "user", "args").stdout.splitlines()[1:]
    assert len(top) >= 3, top
    assert {line.split()[:2][0] for line in top} == {str(UID)}, top
    assert podman("exec", serving.name, "id", "-u").stdout.strip() == str(UID)


def test_health_check_passes(serving: Container, gateway_image: Built) -> None:
    test = inspect("image", gateway_image.tag)["Healthcheck"]["Test"]
    assert "/health" in test[-1]
    # No systemd here to time the periodic checks, so run one: it must pass and mark the container healthy.
    podman("healthcheck", "run", serving.name)
    assert inspect("container", serving.name)["State"]["Health"]["Status"] == "healthy"


def test_stop_drains_streams_in_flight(gateway_image: Built, repo: Path, tmp_path: Path) -> None:
    # Each stream lasts about 30 s (2,000 tokens, about 15 ms each at 8 in flight on field-8gpu), far
    # longer than SIGTERM takes to reach the gateway on a loaded machine (200 tokens, about 3 s, once
    # ended first); the drain waits up to 150 s for them.
    drain = {"SPECGATE_SERVER__DRAIN_TIMEOUT": "150"}
    with running(gateway_image.tag, repo, tmp_path / "container.log", drain) as container:
        _ready(container)
        streams = 8
        started = threading.Barrier(streams + 1, timeout=60)
        ends: list[list[str]] = [[] for _ in range(streams)]

        def stream(i: int) -> None:
            body = {"model": "sim-model", "messages": HI, "max_tokens": 2000, "stream": True}
            with httpx.stream("POST", f"{container.urls['gateway']}/v1/chat/completions", json=body, timeout=240) as r:
                lines = (line for line in r.iter_lines() if line.startswith("data: "))
                ends[i].append(next(lines))
                started.wait()
                ends[i].extend(lines)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        started.wait()  # every stream has its first token: all are in flight
        stopper = threading.Thread(target=podman, args=("stop", "--time=180", container.name), kwargs={"timeout": 200})
        stopper.start()
        gateway = container.urls["gateway"]
        # SIGTERM reached the gateway: it refuses new work and reports draining, the streams still run.
        wait_until(lambda: answers(f"{gateway}/ready", 503), "the gateway to drain", 30)
        seen = [len(lines) for lines in ends]
        refused = httpx.post(f"{gateway}/v1/chat/completions", json={"model": "sim-model", "messages": HI}, timeout=30)
        assert refused.status_code == 503 and set(refused.json()["error"]) >= {"message", "type", "code"}
        stopper.join(timeout=200)
        for thread in threads:
            thread.join(timeout=60)
        state = inspect("container", container.name)["State"]
        assert state["ExitCode"] == 0, state  # 137 would mean podman had to kill it
        for before, lines in zip(seen, ends, strict=True):
            assert len(lines) > before + 1, "the stream got no tokens after the drain began"
            assert lines[-1] == "data: [DONE]", lines[-3:]
            last = json.loads(lines[-2].removeprefix("data: "))
            assert last["choices"][0]["finish_reason"] == "length", last


def test_holds_no_plotting_or_test_packages(gateway_image: Built, repo: Path) -> None:
    script = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    listing = run_once(gateway_image.tag, "-c", script, entrypoint="python")
    installed = {_normalized(name): version for name, version in json.loads(listing).items()}
    assert NOT_IN_IMAGE & set(installed) == set()
    # specgate and exactly the versions its pyproject pins.
    pins = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    for pin in pins:
        name, version = pin.split("==")
        assert installed.get(_normalized(name.split("[")[0])) == version, pin
    assert installed["specgate"] == "0.1.0"


def _normalized(distribution: str) -> str:
    """A distribution's name as PEP 503 compares them (pydantic_core is pydantic-core)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_size_is_reported_and_bounded(gateway_image: Built) -> None:
    assert 0 < gateway_image.size_bytes < MAX_SIZE_BYTES, f"{gateway_image.size_bytes / 1e6:.0f} MB"


def test_relays_in_c_without_a_compiler(gateway_image: Built) -> None:
    # The wheel stage compiles gateway/relay/_sse.c; the compiler stays behind in that stage.
    script = "import shutil, gateway.relay.sse as r; print(r.TokenSink is not None, shutil.which('gcc') or shutil.which('cc'))"
    assert run_once(gateway_image.tag, "-c", script, entrypoint="python").split() == ["True", "None"]
