"""The real SMG router (PyPI `smg`) in front of a baseline's K simulated servers, started as a user would.

`smg launch --worker-urls URL... --policy cache_aware`, every policy knob at SMG's default. Its
health checks go to the servers' `/health` (SMG's default path, named here so it stays that) at
SMG's default interval (60 s): the check SMG makes when it registers a worker is what makes the
worker routable, so startup does not wait for the interval; it is started once its servers answer,
since a worker SMG cannot reach at registration is retried only after 30 s. Its Prometheus
listener goes to a free loopback port (its default, 29000 on every interface, would clash with
another run). SMG routes once `GET /workers` lists every worker healthy. The line it logs at
startup states the policy settings it runs with; the report quotes it.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from backends.process import Child

POLICY = "cache_aware"
HEALTH_ENDPOINT = "/health"
# SMG colours its log even into a file; its startup line reads "... | policy: CacheAware { ... } | ...".
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_POLICY_LINE = re.compile(r"\| policy: (\w+ \{[^}]*\})")


@dataclass(frozen=True)
class Smg:
    """The SMG executable and the version it reports."""

    executable: str
    version: str

    @classmethod
    def probe(cls, executable: str) -> Smg:
        """The router at `executable`, its version read from `smg --version`; RuntimeError if it does not run."""
        try:
            done = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30, check=False)
        except OSError as exc:
            raise RuntimeError(f"cannot run SMG at {executable}: {exc}") from None
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 2 or words[0] != "smg":
            raise RuntimeError(f"{executable} --version did not answer `smg VERSION`: {(done.stdout + done.stderr)[-300:]!r}")
        return cls(executable, words[1])

    def argv(self, host: str, port: int, metrics_port: int, workers: Sequence[str]) -> tuple[str, ...]:
        """`smg launch` in front of `workers`: cache_aware at its defaults, health on `/health`, metrics on loopback."""
        return (
            self.executable, "launch", "--host", host, "--port", str(port), "--worker-urls", *workers,
            "--policy", POLICY, "--health-check-endpoint", HEALTH_ENDPOINT,
            "--prometheus-host", host, "--prometheus-port", str(metrics_port),
        )  # fmt: skip


def policy_settings(log: str) -> str | None:
    """The policy settings SMG's startup line states (`CacheAware { cache_threshold: 0.3, ... }`), or None."""
    match = _POLICY_LINE.search(_ANSI.sub("", log))
    return match[1] if match else None


async def wait_routing(url: str, child: Child, workers: int, timeout: float) -> None:
    """Wait until SMG at `url` lists `workers` workers, all healthy; RuntimeError if it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    seen = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline and child.running:
            try:
                async with session.get(f"{url}/workers") as resp:
                    listed = orjson.loads(await resp.read()).get("workers", []) if resp.status == 200 else []
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                listed = []
            healthy = sum(1 for w in listed if w.get("is_healthy"))
            seen = f"{healthy} of {workers} workers healthy"
            if len(listed) == workers and healthy == workers:
                return
            await asyncio.sleep(0.2)
    state = "exited" if not child.running else f"not routing after {timeout:g} s ({seen})"
    raise RuntimeError(f"SMG at {url} {state}; its last output:\n{child.last_lines()}")
