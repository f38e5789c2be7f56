"""Simulators and `specgate serve` as local child processes, started and waited for: the servers the
tests and the benchmarks run against.

    with running_sim("--role", "eagle", "--time-scale", "0.1") as sim:
        url = sim.url()            # http://127.0.0.1:<port>, the port the sim picked itself

Each server is a `backends.process.Child` logging to a file (no pipe to fill up); these helpers are
synchronous, for test fixtures and benchmark scripts, and always stop what they started on failure.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from backends.process import Child, ProcessExited, descendants
from backends.readiness import wait_until_ready_blocking

_LISTENING = re.compile(r"(\w+) server \(profile [^)]*\) listening on http://(\S+):(\d+)(?: \(group (\d+)\))?")
_SERVING = re.compile(r"serving on (http://\S+)")
_UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # each line in the log file as soon as it is printed


def _temp_log(prefix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return Path(name)


def _await_lines(child: Child, pattern: re.Pattern[str], count: int, timeout: float) -> list[re.Match[str]]:
    """The first `count` matches of `pattern` in the child's log, once it has printed them."""
    deadline = time.monotonic() + timeout
    while True:
        found = list(pattern.finditer(child.output()))
        if len(found) >= count:
            return found[:count]
        if not child.running:
            raise ProcessExited(f"{child.name} exited with status {child.returncode}:\n{child.output()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} did not start in {timeout:g} s:\n{child.output()}")
        time.sleep(0.02)


@dataclass
class SimHandle:
    """A running sim process and the ports of its roles (`ports`: group 0's; `group_ports`: every group's)."""

    child: Child
    ports: dict[str, int] = field(default_factory=dict)
    group_ports: list[dict[str, int]] = field(default_factory=list)
    host: str = "127.0.0.1"
    owns_log: bool = True  # the log is a temporary file of ours, removed by `discard`

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
        return self.child.output()

    @property
    def pid(self) -> int:
        """Process id (also the process group id)."""
        return self.child.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.child.running

    def signal(self, sig: int) -> None:
        """Send `sig` to the sim's process group."""
        self.child.signal_group(sig)

    def wait(self, timeout: float) -> int | None:
        """Exit status after waiting up to `timeout` seconds (None if still running)."""
        return self.child.wait_blocking(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the group, SIGKILL it after `timeout` s; the exit status."""
        return self.child.stop_blocking(timeout)

    def discard(self) -> None:
        """Stop the sim and remove its temporary log."""
        self.stop()
        if self.owns_log and self.child.log_path is not None:
            self.child.log_path.unlink(missing_ok=True)


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


def start_sim(
    *args: str,
    wait_ready: bool = True,
    timeout: float = 20.0,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    nofile: tuple[int, int] | None = None,
) -> SimHandle:
    """Start `python -m backends.sim *args`; return once it listens (and, with `wait_ready`, /ready is 200).

    Its output goes to `log_path`, or to a temporary file that `SimHandle.discard` removes.
    `nofile` (soft, hard) starts it under that open-file limit (with util-linux `prlimit`).
    """
    argv = _with_ports(args)
    limit = ["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", "--"] if nofile is not None else []
    child = Child(
        "sim",
        [*limit, sys.executable, "-m", "backends.sim", *argv],
        env={**_UNBUFFERED, **(env or {})},
        log_path=log_path or _temp_log("sim-"),
    )
    child.start()
    handle = SimHandle(child, owns_log=log_path is None)
    deadline = time.monotonic() + timeout
    try:
        servers = sum(arg in ("--port", "--eagle-port", "--plain-port") for arg in argv)
        for match in _await_lines(child, _LISTENING, servers, timeout):
            handle.host = match[2]
            index = int(match[4] or 0)
            while len(handle.group_ports) <= index:
                handle.group_ports.append({})
            handle.group_ports[index][match[1]] = int(match[3])
        handle.ports = dict(handle.group_ports[0])
        for url in (handle.group_url(g, role) for g, ports in enumerate(handle.group_ports) for role in ports):
            if wait_ready:
                wait_until_ready_blocking(url, child, max(deadline - time.monotonic(), 0.1))
    except BaseException:
        handle.stop(timeout=2.0)
        raise
    return handle


@contextmanager
def running_sim(*args: str, wait_ready: bool = True, timeout: float = 20.0) -> Iterator[SimHandle]:
    """`start_sim` for the duration of a `with` block."""
    handle = start_sim(*args, wait_ready=wait_ready, timeout=timeout)
    try:
        yield handle
    finally:
        handle.discard()


class SimFactory:
    """Starts sims on demand and stops every one of them in `close()`, or on leaving its `with` block."""

    def __init__(self) -> None:
        self.handles: list[SimHandle] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, *args: str, wait_ready: bool = True, timeout: float = 20.0) -> SimHandle:
        """Start a sim that `close()` will stop."""
        handle = start_sim(*args, wait_ready=wait_ready, timeout=timeout)
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        """Stop every sim started here."""
        for handle in self.handles:
            handle.discard()
        self.handles.clear()


@dataclass
class GatewayProcess:
    """A running `specgate serve`, at `url`."""

    child: Child
    url: str = ""
    _final_output: str | None = None  # its whole log, kept once it is dead and the file removed

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The gateway's process, to signal or wait on it alone."""
        assert self.child.proc is not None
        return self.child.proc

    def descendants(self) -> list[int]:
        """The pid of every live process started below the gateway (backends and their children)."""
        return list(descendants(self.child.pid))

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the gateway only (as an orchestrator would) and wait; returns its exit code."""
        if self.child.running:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill_group()

    def kill_group(self) -> None:
        """Last-resort cleanup so a failure never leaks processes: SIGKILL the group and all below it."""
        self.child.note_descendants()
        self.child.stop_blocking(grace=0)
        if self._final_output is None and self.child.log_path is not None:
            self._final_output = self.child.output()
            self.child.log_path.unlink(missing_ok=True)

    def text(self) -> str:
        """Everything the gateway has printed so far."""
        return self.child.output() if self._final_output is None else self._final_output


def start_gateway(
    *args: str,
    config: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
    nofile: tuple[int, int] | None = None,
) -> GatewayProcess:
    """Start `specgate serve --port 0 ...` and return once it prints its 'serving on' line.

    `nofile` (soft, hard) starts it under that open-file limit (with util-linux `prlimit`), as a
    host with a low default would.
    """
    argv = [sys.executable, "-m", "gateway", "serve", "--port", "0", *args]
    if nofile is not None:
        argv = ["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", "--", *argv]
    if config is not None:
        argv += ["--config", str(config)]
    child = Child("gateway", argv, env={**_UNBUFFERED, **(env or {})}, log_path=_temp_log("specgate-serve-"))
    child.start()
    gw = GatewayProcess(child)
    try:
        (serving,) = _await_lines(child, _SERVING, 1, timeout)
    except BaseException:
        gw.kill_group()
        raise
    gw.url = serving[1]
    return gw


@contextmanager
def gateway_with_config(toml: str, directory: Path) -> Iterator[GatewayProcess]:
    """`specgate serve --config` of `toml` (written to `directory`), stopped on leaving."""
    config = directory / "specgate.toml"
    config.write_text(toml)
    gw = start_gateway(config=config)
    try:
        yield gw
    finally:
        gw.stop()
