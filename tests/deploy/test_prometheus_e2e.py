"""A real Prometheus (Debian's binary) scrapes a running `specgate serve` with the repo's scrape config.

`specgate serve` runs its embedded default (two simulated SGLang servers) as a child process on free
loopback ports; deploy/prometheus/prometheus.yml is rewritten only where it names the compose
hosts, so the jobs, labels and rule files under test are the repository's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest

from backends.process import free_loopback_port
from tests.deploy.prometheus_run import (
    answers,
    assert_node_scraped,
    child,
    point_config_at,
    running_prometheus,
    wait_until,
)

pytestmark = pytest.mark.prometheus


def test_prometheus_scrapes_gateway_and_simulated_sglang(repo: Path, tmp_path: Path) -> None:
    gw_port, eagle_port, plain_port = (free_loopback_port() for _ in range(3))
    gateway = f"http://127.0.0.1:{gw_port}"
    env = {
        "SPECGATE_LAUNCH__EAGLE__PORT": str(eagle_port),
        "SPECGATE_LAUNCH__PLAIN__PORT": str(plain_port),
        "SPECGATE_LAUNCH__TIME_SCALE": "0.1",  # simulated decode 10x faster: short requests
    }
    specgate = [str(Path(sys.executable).parent / "specgate"), "serve", "--host", "127.0.0.1", "--port", str(gw_port)]
    stand_ins = {
        "specgate:8000": f"127.0.0.1:{gw_port}",
        "specgate:30001": f"127.0.0.1:{eagle_port}",
        "specgate:30002": f"127.0.0.1:{plain_port}",
    }
    config = point_config_at(repo, tmp_path, stand_ins)
    with child(specgate, tmp_path / "specgate.log", env) as gw_proc:
        wait_until(lambda: answers(f"{gateway}/ready"), "specgate /ready", 90, gw_proc)
        with running_prometheus(config, tmp_path) as (prom, prom_proc):
            client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)
            model = client.models.list().data[0].id
            for _ in range(3):
                client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
            stream = client.completions.create(model=model, prompt="hello", max_tokens=8, stream=True)
            assert "".join(c.choices[0].text for c in stream if c.choices)
            assert_node_scraped(repo, prom, prom_proc, requests=4)
