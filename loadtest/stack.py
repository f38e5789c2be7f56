"""Child processes the envelope starts (the gateway, an extra simulator), and stops on every path.

Each child runs in its own process group (session) so a stop reaches everything it started; on
stop it gets SIGTERM to its group, time to shut down cleanly, then SIGKILL to the group and to any
descendant still alive (one that moved to its own group included). Output goes to a log file
whose tail is shown when a child dies early.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import psutil


def free_port() -> int:
    """A free loopback TCP port (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ChildExited(RuntimeError):
    """A child process ended while we still needed it."""


class Child:
    """One child process in its own process group, logging to `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._descendants: dict[int, psutil.Process] = {}

    @property
    def pid(self) -> int:
        """The child's process id (it is also its process group id)."""
        assert self._proc is not None, f"{self.name} was not started"
        return self._proc.pid

    async def start(self) -> None:
        """Start it; its output goes to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        with self.log_path.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True, env=env,
            )

    def exited(self) -> bool:
        """True once the process has ended."""
        return self._proc is not None and self._proc.returncode is not None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of its output, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def remember_descendants(self) -> None:
        """Note every process the child started so far, to make sure they end with it."""
        try:
            for proc in psutil.Process(self.pid).children(recursive=True):
                self._descendants[proc.pid] = proc
        except psutil.Error:
            pass

    async def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to its group, wait up to `grace` s, then SIGKILL whatever is left."""
        if self._proc is None:
            return
        self.remember_descendants()
        if self._proc.returncode is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proc.wait(), grace)
            except TimeoutError:
                _signal_group(self.pid, signal.SIGKILL)
                await self._proc.wait()
        _signal_group(self.pid, signal.SIGKILL)  # stragglers left in the group
        await _kill_all(list(self._descendants.values()), grace)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _kill_all(procs: list[psutil.Process], grace: float) -> None:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                proc.terminate()
                alive.append(proc)
        except psutil.Error:
            continue
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        alive = [p for p in alive if _running(p)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def wait_until_ok(url: str, child: Child, timeout: float) -> None:
    """Poll `url` until it answers 200; fail early with the child's log if the child dies."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            if child.exited():
                raise ChildExited(f"{child.name} exited before {url} was ready; its last output:\n{child.log_tail()}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready after {timeout:.0f} s; {child.name}'s last output:\n{child.log_tail()}")
            await asyncio.sleep(0.2)
