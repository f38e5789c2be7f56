"""SIGTERM to `specgate serve` (embedded default: it starts its own simulated backends) under load.

While draining, new requests get a 503 OpenAI error and /ready answers 503; requests in flight run
to completion, bounded by `server.drain_timeout`; then the backends it started are stopped and no
process it started is left in the process table.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
import psutil
import pytest

from backends.testbed import GatewayProcess, start_gateway
from tests.reliability.stack import Outcome, exchange, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

IN_FLIGHT = 32
OUTPUT_TOKENS = 64  # ~3 s on the plain sim at 32 running requests, time scale 1
REFUSING_FOR = 2.5  # seconds of new requests sent during a 10 s drain


@asynccontextmanager
async def serving(drain_timeout: float, workers: int) -> AsyncIterator[tuple[GatewayProcess, aiohttp.ClientSession, str]]:
    """`specgate serve` with its embedded backends, and a session; the process group is killed on exit."""
    env = {
        "SPECGATE_SERVER__WORKERS": str(workers),
        "SPECGATE_LAUNCH__TIME_SCALE": "1.0",
        "SPECGATE_SERVER__DRAIN_TIMEOUT": str(drain_timeout),
        "SPECGATE_HEALTH__READY_INTERVAL": "0.5",
    }
    gw = await asyncio.to_thread(start_gateway, env=env)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    try:
        async with session.get(gw.url + "/v1/models") as resp:
            model = orjson.loads(await resp.read())["data"][0]["id"]
        yield gw, session, model
    finally:
        await session.close()
        await asyncio.to_thread(gw.kill_group)


def _body(model: str, max_tokens: int) -> bytes:
    return orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens, "ignore_eos": True,
         "stream": True, "stream_options": {"include_usage": True}}
    )


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]]:
    async with session.get(url) as resp:
        return resp.status, orjson.loads(await resp.read())


def _alive(pids: list[int]) -> list[psutil.Process]:
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


async def _survivors(pids: list[int], within: float = 5.0) -> list[psutil.Process]:
    """Descendants still running `within` s after the gateway exited. With workers, multiprocessing's
    resource tracker exits only once the gateway's end of its pipe has closed, so it may still be
    finishing when the gateway's own exit is seen."""
    deadline = time.monotonic() + within
    while (alive := _alive(pids)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return alive


def _processes_serving(ports: list[str]) -> list[psutil.Process]:
    """Every process in the table whose command line names one of the backends' ports."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if "backends.sim" in cmdline and any(f"--port {port}" in cmdline for port in ports):
            found.append(proc)
    return found


async def _backend_ports(session: aiohttp.ClientSession, url: str) -> list[str]:
    _, status = await _get(session, url + "/admin/status")
    return [b["url"].rsplit(":", 1)[1] for b in status["backends"]]  # type: ignore[index,union-attr]


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_in_flight_requests_then_stops_everything(record_property: pytest.RecordProperty, workers: int) -> None:
    async with serving(drain_timeout=30, workers=workers) as (gw, session, model):
        children = gw.descendants()
        ports = await _backend_ports(session, gw.url)
        assert len(children) >= 2 and len(_processes_serving(ports)) >= 2
        url = gw.url + "/v1/chat/completions"
        flights = [asyncio.create_task(exchange(session, url, _body(model, OUTPUT_TOKENS))) for _ in range(IN_FLIGHT)]
        await until(lambda: _all_inflight(session, gw.url), 20, f"{IN_FLIGHT} requests in flight")

        signalled_at = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        await until(lambda: _ready_is(session, gw.url, 503), 5, "/ready turns 503")
        refused = await exchange(session, url, _body(model, 4))
        outcomes: list[Outcome] = await asyncio.gather(*flights)
        code = await asyncio.to_thread(gw.proc.wait, 60)
        stopped_after = time.monotonic() - signalled_at
        survivors = await _survivors(children)
        serving_ports = _processes_serving(ports)

    record_property("in_flight_at_sigterm", IN_FLIGHT)
    record_property("in_flight_completed", sum(1 for o in outcomes if o.completed))
    record_property("exit_after_sigterm_s", round(stopped_after, 2))
    record_property("orphans", len(survivors) + len(serving_ports))

    assert refused.status == 503 and refused.error is not None and refused.error["code"] == "shutting_down", refused
    assert all(o.completed and o.completion_tokens == OUTPUT_TOKENS for o in outcomes), [o for o in outcomes if not o.completed][:2]
    assert all(o.ended_at < signalled_at + stopped_after for o in outcomes)  # type: ignore[operator]
    assert code == 0, gw.text()[-2000:]
    assert not survivors, f"left running: {survivors}"
    assert not serving_ports, f"still serving the backends' ports: {serving_ports}"


@pytest.mark.parametrize("workers", [1, 2])
async def test_drain_is_bounded_by_the_drain_timeout(record_property: pytest.RecordProperty, workers: int) -> None:
    drain_timeout = 2.0
    async with serving(drain_timeout=drain_timeout, workers=workers) as (gw, session, model):
        children = gw.descendants()
        url = gw.url + "/v1/chat/completions"
        endless = asyncio.create_task(exchange(session, url, _body(model, 100_000)))
        await until(lambda: _all_inflight(session, gw.url, 1), 20, "the long request in flight")

        signalled_at = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(gw.proc.wait, 60)
        stopped_after = time.monotonic() - signalled_at
        outcome = await asyncio.wait_for(endless, 10)
        survivors = await _survivors(children)

    record_property("drain_timeout_s", drain_timeout)
    record_property("exit_after_sigterm_s", round(stopped_after, 2))
    assert code == 0, gw.text()[-2000:]
    # It waited for the request about the drain timeout, not for the request's ~80 minutes.
    assert drain_timeout <= stopped_after < drain_timeout + 15
    assert not outcome.completed and outcome.ended_at - signalled_at < stopped_after + 1, outcome  # type: ignore[operator]
    assert outcome.clean_error and outcome.error["code"] == "shutting_down", outcome  # type: ignore[index]
    assert not survivors


async def test_every_worker_answers_503_until_the_whole_gateway_is_idle() -> None:
    """One stream in flight holds one worker; the other worker, with nothing of its own to drain, must
    not stop: a connection the kernel hands it would be reset instead of refused."""
    async with serving(drain_timeout=10.0, workers=2) as (gw, session, model):
        workers = [p for p in map(psutil.Process, gw.descendants()) if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2, workers
        url = gw.url + "/v1/chat/completions"
        endless = asyncio.create_task(exchange(session, url, _body(model, 100_000)))
        await until(lambda: _all_inflight(session, gw.url, 1), 20, "the long request in flight")

        gw.proc.send_signal(signal.SIGTERM)
        await until(lambda: _ready_is(session, gw.url, 503), 5, "/ready turns 503")
        # New requests for a while, well inside the drain timeout, each on a connection of its own so the
        # kernel spreads them over both workers.
        refused = []
        window_ends = time.monotonic() + REFUSING_FOR
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            while time.monotonic() < window_ends or len(refused) < 10:
                refused.append(await exchange(fresh, url, _body(model, 4), timeout=10))
        still_serving = [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        drained = endless.done()
        code = await asyncio.to_thread(gw.proc.wait, 60)
        outcome = await asyncio.wait_for(endless, 10)

    assert all(o.status == 503 and o.error is not None and o.error["code"] == "shutting_down" for o in refused), [
        o for o in refused if o.status != 503
    ][:2]
    assert not drained and len(still_serving) == 2, still_serving
    assert code == 0, gw.text()[-2000:]
    assert outcome.clean_error and outcome.error["code"] == "shutting_down", outcome  # type: ignore[index]


async def _all_inflight(session: aiohttp.ClientSession, url: str, count: int = IN_FLIGHT) -> bool:
    _, status = await _get(session, url + "/admin/status")
    return status["inflight"] == count


async def _ready_is(session: aiohttp.ClientSession, url: str, code: int) -> bool:
    status, _ = await _get(session, url + "/ready")
    return status == code

