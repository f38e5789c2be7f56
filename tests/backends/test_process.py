"""backends.process.Child and the readiness wait that watches it: start, exit, stop, leftovers."""

from __future__ import annotations

import asyncio
import itertools
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

import backends.process
from backends.process import Child, ProcessExited, descendants, free_loopback_port
from backends.readiness import wait_ready, wait_until_ready


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_wait_reports_the_exit_status_without_polling(tmp_path: Path) -> None:
    child = Child("short", ["sh", "-c", "echo bye; exit 3"], log_path=tmp_path / "short.log")
    child.start()
    assert await asyncio.wait_for(child.wait(), 10) == 3
    assert child.last_lines() == "bye" and not child.running


async def test_stop_also_kills_a_descendant_that_left_the_group(tmp_path: Path) -> None:
    # setsid puts the sleeper in a session of its own: a group signal no longer reaches it.
    script = "setsid sleep 600 & echo started; exec sleep 600"
    child = Child("parent", ["sh", "-c", script], log_path=tmp_path / "parent.log")
    child.start()
    while "started" not in child.output():
        await asyncio.sleep(0.02)
    below = list(descendants(child.pid))
    assert below and all(_alive(pid) for pid in below)
    assert await child.stop(grace=5) == -signal.SIGTERM
    for _ in range(100):
        if not any(_alive(pid) for pid in below):
            break
        await asyncio.sleep(0.05)
    assert not any(_alive(pid) for pid in below)


def test_stop_blocking_works_from_synchronous_code(tmp_path: Path) -> None:
    child = Child("sleeper", ["sleep", "600"], log_path=tmp_path / "sleeper.log")
    child.start()
    assert child.wait_blocking(0.05) is None
    assert child.stop_blocking(grace=5) == -signal.SIGTERM
    assert child.stop_blocking(grace=5) == -signal.SIGTERM  # idempotent


async def test_without_a_log_file_output_goes_to_the_tail(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="specgate.backend")
    child = Child("talker", ["sh", "-c", "printf 'one\\ntwo\\rthree\\n'"])
    child.start()
    await child.wait()
    await child.clear_group()
    assert list(child.tail) == ["one", "three"]  # a \\r redraw keeps only the line's last state
    assert "[talker] three" in caplog.text


async def test_waiting_for_ready_stops_when_the_server_exits(tmp_path: Path) -> None:
    child = Child("dies", ["sh", "-c", "echo no model here; exit 1"], log_path=tmp_path / "dies.log")
    child.start()
    url = f"http://127.0.0.1:{free_loopback_port()}"  # nothing listens: 'loading' until the exit is seen
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ProcessExited, match="no model here"):
            await asyncio.wait_for(wait_ready(session, url, child=child), 10)


async def test_waiting_for_ready_gives_up_after_its_timeout(tmp_path: Path) -> None:
    child = Child("silent", ["sleep", "600"], log_path=tmp_path / "silent.log")
    child.start()
    try:
        with pytest.raises(TimeoutError, match="not ready after 0.5 s"):
            await wait_until_ready(f"http://127.0.0.1:{free_loopback_port()}", child, 0.5)
    finally:
        await child.stop(grace=5)


async def test_waiting_for_ready_returns_once_the_server_answers(tmp_path: Path) -> None:
    port = free_loopback_port()
    argv = [sys.executable, "-m", "backends.sim", "--role", "plain", "--port", str(port), "--time-scale", "0.1"]
    child = Child("sim", argv, env={"PYTHONUNBUFFERED": "1"}, log_path=tmp_path / "sim.log")
    child.start()
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}", child, 30)
        assert child.running
    finally:
        assert await child.stop(grace=10) == 0


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = backends.process._ephemeral_range()
    ports = [free_loopback_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= port < low for port in ports)
    for port in ports[:20]:  # each one free for a listener
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_or_handed_out_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    given = free_loopback_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(backends.process, "_ephemeral_range", lambda: (60_000, 60_999))
        # Then every port up from `given`: the next one may be in use by another test process too.
        candidates = itertools.chain([busy, given], (p for p in range(given + 1, 60_000) if p != busy))
        tried: list[int] = []

        def pick(lo: int, hi: int) -> int:
            tried.append(next(candidates))
            return tried[-1]

        monkeypatch.setattr(backends.process._rng, "randrange", pick)
        port = free_loopback_port()
        assert tried[:2] == [busy, given] and port == tried[-1]
        assert port not in (busy, given)


def test_without_room_below_the_range_the_kernel_picks_and_no_port_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends.process, "_ephemeral_range", lambda: (10_500, 60_999))
    ports = [free_loopback_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
