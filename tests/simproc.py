"""Run simulated SGLang servers (`python -m backends.sim`) as child processes in tests.

    with running_sim("--role", "eagle", "--time-scale", "0.1") as sim:
        url = sim.url()            # http://127.0.0.1:<port>, the port the sim picked itself

Each sim gets its own session (process group), its output goes to a log file (no pipe to fill up),
and `stop()` sends SIGTERM to the group, then SIGKILL if it does not exit; `running_sim` and
`SimFactory` always stop what they started, also when the test fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"(\w+) server \(profile [^)]*\) listening on http://(\S+):(\d+)(?: \(group (\d+)\))?")
READY_LINE = "The server is fired up and ready to roll!"


class SimStartError(RuntimeError):
    """The sim exited or did not come up in time; the message ends with its log."""


@dataclass
class SimHandle:
    """A running sim process and the ports of its roles (`ports`: group 0's; `group_ports`: every group's)."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)
    group_ports: list[dict[str, int]] = field(default_factory=list)
    host: str = "127.0.0.1"

    def url(self, role: str | None = None) -> str:
        """Base URL of `role` (the only role when None)."""
        if role is None:
            if len(self.ports) != 1:
                raise ValueError(f"this sim serves {sorted(self.ports)}; name a role")
            role = next(iter(self.ports))
        return f"http://{self.host}:{self.ports[role]}"

    def group_url(self, group: int, role: str | None = None) -> str:
        """Base URL of `role` in group (or replica) `group` (the group's only role when None)."""
        ports = self.group_ports[group]
        if role is None:
            if len(ports) != 1:
                raise ValueError(f"group {group} serves {sorted(ports)}; name a role")
            role = next(iter(ports))
        return f"http://{self.host}:{ports[role]}"

    def log(self) -> str:
        """Everything the sim has printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        """Process id (also the process group id)."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to the sim's process group."""
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """Exit status after waiting up to `timeout` seconds (None if still running)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM the group, SIGKILL it after `timeout` s; the exit status."""
        if self.alive():
            self.signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.signal(signal.SIGKILL)
        code = self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything the sim may have left in its group
        except ProcessLookupError:
            pass
        return code


def _with_ports(args: Sequence[str]) -> list[str]:
    """`args`, with port 0 (the sim picks) for every port the caller left out."""
    out = list(args)
    if "--colocated" in out:
        for flag in ("--eagle-port", "--plain-port"):
            if flag not in out:
                out += [flag, "0"]
    elif "--port" not in out:
        out += ["--port", "0"]
    return out


def _servers(argv: Sequence[str]) -> int:
    """How many servers the sim started with `argv` will log as listening."""
    return sum(arg in ("--port", "--eagle-port", "--plain-port") for arg in argv)


def _get_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def start_sim(
    *args: str, wait_ready: bool = True, timeout: float = 20.0, env: dict[str, str] | None = None
) -> SimHandle:
    """Start `python -m backends.sim *args` and wait until it listens (and, with `wait_ready`, /ready is 200)."""
    argv = _with_ports(args)
    expected = _servers(argv)
    log_fd, log_name = tempfile.mkstemp(prefix="sim-", suffix=".log")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backends.sim", *argv],
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
    handle = SimHandle(proc=proc, log_path=Path(log_name))
    try:
        _wait_up(handle, expected, wait_ready, time.monotonic() + timeout)
    except BaseException:
        handle.stop(timeout=2.0)
        raise
    return handle


def _wait_up(handle: SimHandle, expected: int, wait_ready: bool, deadline: float) -> None:
    while True:
        found = _LISTENING.findall(handle.log())
        if len(found) >= expected:
            for role, host, port, group in found:
                handle.host = host
                index = int(group or 0)
                while len(handle.group_ports) <= index:
                    handle.group_ports.append({})
                handle.group_ports[index][role] = int(port)
            handle.ports = dict(handle.group_ports[0])
            break
        if not handle.alive():
            raise SimStartError(f"sim exited with {handle.proc.returncode}:\n{handle.log()}")
        if time.monotonic() > deadline:
            raise SimStartError(f"sim did not start listening in time:\n{handle.log()}")
        time.sleep(0.02)
    if not wait_ready:
        return
    pending = {f"http://{handle.host}:{port}" for ports in handle.group_ports for port in ports.values()}
    while pending:
        pending = {url for url in pending if _get_status(url + "/ready", timeout=1.0) != 200}
        if not pending:
            return
        if not handle.alive():
            raise SimStartError(f"sim exited with {handle.proc.returncode}:\n{handle.log()}")
        if time.monotonic() > deadline:
            raise SimStartError(f"sim was not ready in time:\n{handle.log()}")
        time.sleep(0.02)


@contextmanager
def running_sim(*args: str, wait_ready: bool = True, timeout: float = 20.0) -> Iterator[SimHandle]:
    """`start_sim` for the duration of a `with` block."""
    handle = start_sim(*args, wait_ready=wait_ready, timeout=timeout)
    try:
        yield handle
    finally:
        handle.stop()
        handle.log_path.unlink(missing_ok=True)


class SimFactory:
    """Starts sims on demand and stops every one of them in `close()` (use it as a fixture)."""

    def __init__(self) -> None:
        self.handles: list[SimHandle] = []

    def start(self, *args: str, wait_ready: bool = True, timeout: float = 20.0) -> SimHandle:
        """Start a sim that `close()` will stop."""
        handle = start_sim(*args, wait_ready=wait_ready, timeout=timeout)
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        """Stop every sim started here."""
        for handle in self.handles:
            handle.stop()
            handle.log_path.unlink(missing_ok=True)
        self.handles.clear()
