"""Two `specgate serve` nodes (simulated backends) behind the real SMG router, and traffic through it.

SMG comes from PyPI (`smg`, the version pinned in .ci/run) in a venv of its own; SPECGATE_SMG
names its `smg` executable. Each node is one SMG worker; SMG says which node served a request in
the `x-smg-routed-worker-id` response header (the node's URL).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backends.process import Child, free_loopback_port
from backends.testbed import GatewayProcess, start_gateway

ROUTED = "x-smg-routed-worker-id"
# Every node: the default launch (an EAGLE-3 and a plain simulated server), decoding 5x faster
# than the profile so requests are short. `max_running` caps each server's batch.
NODE_CONFIG = """
[launch]
engine = "sim"
profile = "llama8b-h100"
time_scale = 0.2
"""
CAPPED = """
[launch.eagle]
max_running_requests = {max_running}

[launch.plain]
max_running_requests = {max_running}
"""


def smg_executable() -> str | None:
    """SPECGATE_SMG, else an `smg` on PATH; None when neither is there."""
    return os.environ.get("SPECGATE_SMG") or shutil.which("smg")


def node_config(directory: Path, name: str, max_running: int | None = None) -> Path:
    """A node's config file; `max_running` caps each of its servers' running requests."""
    path = directory / f"{name}.toml"
    path.write_text(NODE_CONFIG + (CAPPED.format(max_running=max_running) if max_running else ""))
    return path


def start_node(config: Path, port: int | None = None) -> GatewayProcess:
    """`specgate serve` with `config`, on `port` (a free one when None)."""
    return start_gateway("--port", str(port), config=config) if port else start_gateway(config=config)


def start_smg(executable: str, workers: list[str], log: Path) -> tuple[Child, str]:
    """SMG with its load-aware policy in front of `workers`; the child and its URL.

    power_of_two with the expected-wait metric reads each worker's /v1/loads (polled every second
    here): queued token-work over generation throughput, plus a KV-pressure term. Each request
    it sends counts as `--least-load-mean-prefill-tokens` tokens of work until the next poll;
    these tests' prompts are a few tokens, so that estimate is set near them. SMG's other guards
    that take a busy worker out of routing (a queue 8 deep, a worker slow to make progress) are
    off, so the split measured is the policy's own. Health checks run every second on /ready (as in
    deploy/k8s/smg.yaml) so a dead node is seen quickly; unhealthy workers stay registered (no
    service discovery re-adds them), so a node that returns is probed back in.
    """
    port, metrics_port = free_loopback_port(), free_loopback_port()
    argv = [
        executable, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
        "--policy", "power_of_two", "--power-of-two-load-metric", "expected_wait",
        "--load-monitor-interval", "1", "--least-load-mean-prefill-tokens", "16",
        "--health-check-endpoint", "/ready", "--health-check-interval-secs", "1", "--health-check-timeout-secs", "5",
        "--health-failure-threshold", "2", "--health-success-threshold", "1",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-wedge-secs", "600", "--disable-worker-overload-protection",
    ]  # fmt: skip
    child = Child("smg", argv, log_path=log)
    child.start()
    return child, f"http://127.0.0.1:{port}"


async def until(check: Callable[[], Awaitable[Any] | Any], what: str, timeout: float) -> Any:
    """Poll `check` (plain or async) until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def smg_workers(http: httpx.AsyncClient, smg: str) -> dict[str, dict[str, Any]]:
    """SMG's registered workers by URL, with its health verdict and the load it last read."""
    return {w["url"]: w for w in (await http.get(f"{smg}/workers", timeout=5)).json()["workers"]}


@dataclass(frozen=True)
class Outcome:
    """One request through SMG: when it was sent, whether it succeeded, which node served it."""

    sent_at: float
    ok: bool
    node: str | None
    detail: str = ""


@dataclass
class Traffic:
    """Closed loops of short chats through SMG, each outcome recorded."""

    http: httpx.AsyncClient
    url: str
    model: str
    outcomes: list[Outcome] = field(default_factory=list)

    async def one(self, max_tokens: int = 16) -> Outcome:
        """Send one chat and record how it went."""
        sent = time.monotonic()
        body = {"model": self.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": max_tokens}
        try:
            response = await self.http.post(f"{self.url}/v1/chat/completions", json=body, timeout=60)
            ok = response.status_code == 200 and bool(response.json().get("choices"))
            outcome = Outcome(sent, ok, response.headers.get(ROUTED), "" if ok else response.text[:300])
        except httpx.HTTPError as exc:
            outcome = Outcome(sent, False, None, repr(exc))
        self.outcomes.append(outcome)
        return outcome

    async def loop(self, concurrency: int, done: Callable[[], bool]) -> None:
        """`concurrency` clients, each sending its next chat when its last one ends, until `done()`."""

        async def client() -> None:
            while not done():
                await self.one()

        await asyncio.gather(*(client() for _ in range(concurrency)))

    async def count(self, concurrency: int, requests: int, max_tokens: int = 16) -> Counter[str | None]:
        """Send `requests` chats from `concurrency` clients; how many each node served (None: failed)."""
        tickets = iter(range(requests))

        async def client() -> list[Outcome]:
            return [await self.one(max_tokens) for _ in tickets]

        sent = [o for batch in await asyncio.gather(*(client() for _ in range(concurrency))) for o in batch]
        return Counter(o.node if o.ok else None for o in sent)

    def since(self, moment: float) -> list[Outcome]:
        """Every request sent after `moment` (time.monotonic())."""
        return [o for o in self.outcomes if o.sent_at > moment]


async def busy(http: httpx.AsyncClient, server: str, model: str, streams: int, prompt_tokens: int, stop: asyncio.Event) -> None:
    """`streams` closed loops of long-prompt chats sent to one simulated server directly, until `stop`.

    Every prompt starts with a word of its own, so the server's prefix cache serves none of it: each
    one queues its whole prefill, the work SMG reads from `/v1/loads`.
    """
    sent = itertools.count()

    async def stream() -> None:
        while not stop.is_set():
            prompt = f"busy{next(sent)} " + "the " * (prompt_tokens - 1)
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64}
            await http.post(f"{server}/v1/chat/completions", json=body, timeout=120)

    await asyncio.gather(*(stream() for _ in range(streams)))
