"""The `runtime` target's own steps, built on a stand-in for the SGLang image.

lmsysorg/sglang:v0.5.23-cu130-runtime cannot be pulled here (no registry), so SGLANG_IMAGE is the
Debian Python base instead. What that checks: every COPY and RUN of the `sglang-venv` and `runtime`
stages (specgate's own venv built with the base's pip, the non-root user, the writable caches, the
`specgate` link on PATH, the health check), and that the result serves. What it cannot check: SGLang
itself, CUDA, and FlashInfer's cubin directory (absent here, so that step is skipped as on an image
without it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.deploy.prometheus_run import answers, wait_until
from tests.image.conftest import BUILT
from tests.image.podman import Built, Container, build, inspect, podman, run_once, running

# The first test also waits for the image build (pip downloads): it may need more than the default 120 s.
pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def runtime_image(request: pytest.FixtureRequest, base_image: str) -> Built:
    built = build(
        request.config.rootpath,
        "runtime",
        "localhost/specgate-runtime-standin:ci",
        {"PYTHON_IMAGE": base_image, "SGLANG_IMAGE": base_image},
    )
    request.config.stash.setdefault(BUILT, []).append(built)
    return built


@pytest.fixture(scope="module")
def serving(runtime_image: Built, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    logs = tmp_path_factory.mktemp("runtime") / "container.log"
    with running(runtime_image.tag, repo, logs) as container:
        wait_until(lambda: answers(f"{container.urls['gateway']}/ready"), f"{container.name} /ready", 90)
        yield container


def test_runtime_image_serves_as_the_non_root_user(serving: Container, runtime_image: Built) -> None:
    client = openai.OpenAI(base_url=f"{serving.urls['gateway']}/v1", api_key="unused", max_retries=0, timeout=60)
    hi = [{"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(model="sim-model", messages=hi, max_tokens=8)
    assert reply.choices[0].message.content
    assert podman("exec", serving.name, "id", "-u").stdout.strip() == "10001"
    assert "/health" in inspect("image", runtime_image.tag)["Healthcheck"]["Test"][-1]
    podman("healthcheck", "run", serving.name)
    assert inspect("container", serving.name)["State"]["Health"]["Status"] == "healthy"


def test_python3_stays_the_base_images_interpreter(serving: Container) -> None:
    # The launcher runs `python3 -m sglang.launch_server`: python3 must not be specgate's venv.
    assert podman("exec", serving.name, "sh", "-c", "command -v python3").stdout.strip() == "/usr/bin/python3"
    assert podman("exec", serving.name, "sh", "-c", "readlink -f \"$(command -v specgate)\"").stdout.strip() == (
        "/opt/specgate/bin/specgate"
    )


def test_caches_are_writable_under_an_arbitrary_uid(runtime_image: Built) -> None:
    # OpenShift runs the image under a random UID in group 0: the caches and home must still be writable.
    probe = "mkdir -p $TRITON_CACHE_DIR $HF_HOME && touch $TRITON_CACHE_DIR/probe $HOME/probe && echo $TRITON_CACHE_DIR"
    written = run_once(runtime_image.tag, "-c", probe, entrypoint="sh", user="123456:0")
    assert written.strip() == "/var/cache/specgate/triton"
