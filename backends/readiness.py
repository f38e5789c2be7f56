"""Is a starting SGLang server ready? Probed the way SGLang actually starts.

While it loads weights and captures CUDA graphs its HTTP port is not bound yet (connection
refused); then uvicorn serves but `/ready` answers 503 while the warm-up request runs; then 200.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from backends.process import Child, ProcessExited, run_blocking

PROBE_TIMEOUT = 5.0
FIRST_INTERVAL = 0.1
MAX_INTERVAL = 1.0


class Stage(enum.Enum):
    """What a readiness probe saw."""

    LOADING = "loading"  # connection refused: port not bound yet
    WARMING_UP = "warming up"  # 503
    READY = "ready"  # 200
    REJECTED = "rejected"  # 401/403: the API key is wrong, waiting will not help
    UNEXPECTED = "unexpected answer"  # anything else (timeouts, other statuses)


@dataclass(frozen=True)
class Probe:
    """One probe's outcome; `detail` says what exactly was seen."""

    stage: Stage
    detail: str


class RejectedError(RuntimeError):
    """The server refuses the probes' credentials."""


async def probe_ready(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Probe:
    """GET `url`/ready once."""
    try:
        async with session.get(
            f"{url}/ready", headers=headers, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
        ) as resp:
            await resp.read()
            status = resp.status
    except aiohttp.ClientConnectorError:
        return Probe(Stage.LOADING, "connection refused")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Probe(Stage.UNEXPECTED, type(exc).__name__)
    if status == 200:
        return Probe(Stage.READY, "200")
    if status == 503:
        return Probe(Stage.WARMING_UP, "503")
    if status in (401, 403):
        return Probe(Stage.REJECTED, str(status))
    return Probe(Stage.UNEXPECTED, f"HTTP {status}")


async def wait_ready(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str] | None = None,
    on_change: Callable[[Probe], None] | None = None,
    *,
    child: Child | None = None,
) -> None:
    """Probe until `url`/ready answers 200; `on_change` hears each new stage. No timeout of its own.

    With `child`, raises ProcessExited (with its last output) as soon as that process has ended.
    """
    interval = FIRST_INTERVAL
    last: Stage | None = None
    while True:
        probe = await probe_ready(session, url, headers or {})
        if probe.stage != last:
            last = probe.stage
            if on_change is not None:
                on_change(probe)
        if probe.stage is Stage.READY:
            return
        if probe.stage is Stage.REJECTED:
            raise RejectedError(f"{url}/ready answers {probe.detail}: check launch.backend_api_key")
        if child is not None and not child.running:
            raise ProcessExited(
                f"{child.name} exited with status {child.returncode} before {url} was ready; "
                f"its last output:\n{child.last_lines()}"
            )
        await asyncio.sleep(interval)
        # Fast at first (the simulator is up in well under a second), then 1/s for a model load.
        interval = min(interval * 1.5, MAX_INTERVAL)


async def wait_until_ready(url: str, child: Child, timeout: float, headers: dict[str, str] | None = None) -> None:
    """`wait_ready` on a session of its own, for at most `timeout` s, while `child` (the server) runs."""
    async with aiohttp.ClientSession() as session:
        try:
            await asyncio.wait_for(wait_ready(session, url, headers, child=child), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{url} not ready after {timeout:g} s; {child.name}'s last output:\n{child.last_lines()}"
            ) from None


def wait_until_ready_blocking(url: str, child: Child, timeout: float) -> None:
    """`wait_until_ready` for synchronous callers (test fixtures, benchmark scripts)."""
    run_blocking(wait_until_ready(url, child, timeout))
