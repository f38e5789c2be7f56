"""1,000 concurrent streams through `specgate serve` started under a soft open-file limit of 1024.

With room to raise it (hard limit >= 8192) the gateway raises it at start-up and every stream
completes. Without (1024:1024) the gateway refuses what does not fit with 429/503 and Retry-After,
never marks a backend out for its own limit (polled in /admin/status during the burst, and in its
log), and serves normally again right after the burst. One worker: the limit and its budget are a
process's (each of several workers has its own).
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
from pathlib import Path

import aiohttp
import orjson
import pytest

from backends.testbed import SimFactory, start_sim
from tests.reliability.stack import Outcome, Stack, exchange, running_stack, until

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit"),
]

BURST = 1000
OUTPUT_TOKENS = 4
TIME_SCALE = 0.1
GATEWAY = {"health": {"ready_interval": 0.2}, "timeouts": {"first_byte": 60, "idle": 30}}
_HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def _burst(stack: Stack) -> tuple[list[Outcome], list[dict[str, str]], int]:
    """BURST concurrent streams; returns their outcomes, the backend states polled meanwhile and the gateway's peak fds."""
    url = stack.url + "/v1/chat/completions"
    body = stack.chat(OUTPUT_TOKENS, stream=True)
    polled: list[dict[str, str]] = []
    peak = 0
    load = asyncio.gather(*(exchange(stack.session, url, body, stack.client_headers) for _ in range(BURST)))
    # One keep-alive connection of its own, opened before the burst.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as admin:
        await _states(admin, stack)
        while not load.done():
            polled.append(await _states(admin, stack))
            peak = max(peak, _open_fds(stack.gw.proc.pid))
            await asyncio.sleep(0.05)
    return await load, polled, peak


async def _states(session: aiohttp.ClientSession, stack: Stack) -> dict[str, str]:
    async with session.get(stack.url + "/admin/status", headers=stack.admin_headers) as resp:
        return {b["name"]: b["state"] for b in orjson.loads(await resp.read())["backends"]}


async def _idle(stack: Stack) -> bool:
    return await stack.inflight() == 0


async def _follow_up_completes(stack: Stack) -> bool:
    out = await exchange(stack.session, stack.url + "/v1/chat/completions", stack.chat(OUTPUT_TOKENS, stream=True))
    return out.completed


def _transitions(log: str) -> list[str]:
    return [line for line in log.splitlines() if "specgate.health" in line and " -> " in line and "-> ready" not in line]


@pytest.mark.skipif(_HARD != resource.RLIM_INFINITY and _HARD < 8192, reason="needs a hard open-file limit >= 8192")
async def test_gateway_raises_a_low_soft_limit_and_serves_a_burst(sims: SimFactory, record_property: pytest.RecordProperty) -> None:
    hard = 20000 if _HARD == resource.RLIM_INFINITY else min(_HARD, 65536)
    async with running_stack(sims, time_scale=TIME_SCALE, gateway=GATEWAY, workers=1, connections=BURST + 16, nofile=(1024, hard)) as stack:
        limits = (await stack.get_json(stack.url + "/admin/status", stack.admin_headers))["limits"]
        assert limits["open_files_soft_limit"] == hard  # raised from 1024
        assert limits["inflight_capacity"] >= BURST
        outcomes, polled, peak = await _burst(stack)
        completed = sum(o.completed for o in outcomes)
        record_property("completed", completed)
        record_property("gateway_peak_fds", peak)
        assert completed == BURST, [o for o in outcomes if not o.completed][:3]
        assert all(state == "ready" for states in polled for state in states.values())
        assert await until(lambda: _idle(stack), 10, "in-flight back to 0")
        assert "open-file limit" in stack.gw.text()


async def test_at_a_hard_limit_of_1024_the_gateway_refuses_cleanly_and_keeps_the_backends(
    sims: SimFactory, record_property: pytest.RecordProperty
) -> None:
    async with running_stack(sims, time_scale=TIME_SCALE, gateway=GATEWAY, workers=1, connections=BURST + 16, nofile=(1024, 1024)) as stack:
        limits = (await stack.get_json(stack.url + "/admin/status", stack.admin_headers))["limits"]
        assert limits["open_files_soft_limit"] == 1024
        assert limits["inflight_capacity"] < BURST
        outcomes, polled, peak = await _burst(stack)
        loop = asyncio.get_running_loop()
        burst_over = loop.time()
        await until(lambda: _follow_up_completes(stack), 1.0, "a request completes after the burst", every=0)
        normal_after = loop.time() - burst_over

        completed = [o for o in outcomes if o.completed]
        refused = [o for o in outcomes if o.status in (429, 503) and o.retry_after and o.clean_error]
        other = [o for o in outcomes if not o.completed and o not in refused]
        record_property("completed", len(completed))
        record_property("refused", len(refused))
        record_property("gateway_peak_fds", peak)
        record_property("normal_after_s", round(normal_after, 3))
        assert not other, other[:3]
        assert completed, "the gateway served nothing under its limit"
        assert polled and all(state == "ready" for states in polled for state in states.values()), polled
        assert _transitions(stack.gw.text()) == []
        # Refused before running out: no connect failed for want of a descriptor.
        assert await stack.metric("specgate_local_errors_total", kind="emfile") == 0
        assert await stack.metric("specgate_local_errors_total", kind="descriptors") > 0
        assert "allows" in stack.gw.text() and "limits.max_inflight" in stack.gw.text()
        assert await until(lambda: _idle(stack), 10, "in-flight back to 0")


def _soft_nofile(pid: int) -> int:
    line = next(row for row in Path(f"/proc/{pid}/limits").read_text().splitlines() if row.startswith("Max open files"))
    return int(line.split()[3])


@pytest.mark.skipif(_HARD != resource.RLIM_INFINITY and _HARD < 8192, reason="needs a hard open-file limit >= 8192")
def test_the_simulator_raises_its_own_limit_as_sglang_does() -> None:
    hard = 20000 if _HARD == resource.RLIM_INFINITY else min(_HARD, 65536)
    sim = start_sim("--role", "plain", nofile=(1024, hard))
    try:
        assert _soft_nofile(sim.pid) == hard
    finally:
        sim.discard()
