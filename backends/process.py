"""One child OS process, started in its own session and stopped with nothing left behind.

Every process specgate starts goes through `Child`: the supervisor's backends, the load tester's
gateway and simulators, the tests' and benchmarks' servers. Signals go to the whole process group
(never just the pid): SGLang's launcher forks scheduler and detokenizer processes into its group,
and only signalling the group leaves no GPU memory held behind. Descendants that moved to a group
of their own (the backends of a `specgate serve` child) are noted before a stop and killed after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("specgate.backend")

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_LINE_LIMIT = 1 << 20  # SGLang prints long lines (server args, tracebacks)
TAIL_LINES = 30


class ProcessExited(RuntimeError):
    """A child process ended while it was still needed; the message ends with its last output."""


# Ports below the kernel's ephemeral range: no outgoing connection takes one as its source port.
_LOWEST_PORT = 10_000
_handed_out: set[int] = set()
_rng = random.SystemRandom()  # not the shared generator: a seeded one would give every process the same ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def _bindable(port: int) -> int | None:
    """`port` if a listener could bind it on 127.0.0.1 now (0: the kernel's pick), else None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
            return int(sock.getsockname()[1])
    except OSError:
        return None


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now and that this process has not handed out before.

    Picked below the kernel's ephemeral range where it leaves room: a port the kernel picks for a
    bind to port 0 is an ephemeral one, which any connection on the host (the gateway's own, to a
    server on 127.0.0.1) may take as its source port before the listener binds it, and the kernel
    may pick the same port twice in a row (a CI run lost a container's published port to one of these).
    """
    low, _ = _ephemeral_range()
    room = low - _LOWEST_PORT >= 1_000
    for _ in range(100):
        # Without room below the range (a tuned host), the kernel's pick, checked against the ones handed out.
        port = _bindable(_rng.randrange(_LOWEST_PORT, low)) if room else _bindable(0)
        if port is not None and port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError("found no free TCP port on 127.0.0.1")


def run_blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to completion from synchronous code (a test fixture, a benchmark script).

    It runs on a private event loop in a worker thread, so it works whether or not the calling
    thread is itself running an event loop.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result()


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that asks the kernel to SIGKILL the child when its parent dies.

    PR_SET_PDEATHSIG fires when the thread that forked the child exits; callers start children from
    their main or event-loop thread, which lives as long as they do. Linux only; elsewhere nothing is set.
    """
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: nothing may be loaded after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


class Child:
    """One process in its own session; `start` may be called again after it exited (a restart).

    With `log_path` its output goes straight to that file; without, it is forwarded line by line to
    the `specgate.backend` logger as `[name] line` (then `start` must run inside an event loop).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env or {})
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() of the last start
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._forwarder: asyncio.Task[None] | None = None
        self._descendants: dict[int, str] = {}  # pid -> start time, to never signal a reused pid

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once it exited (negative: killed by that signal), else None."""
        return None if self.proc is None else self.proc.poll()

    def start(self) -> None:
        """Start the process in a new session (its own process group)."""
        env = {**os.environ, **self.env}
        self._descendants.clear()
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("wb") as out:
                self.proc = self._popen(env, out.fileno())
        else:
            # Our own pipe, read on the event loop: a grandchild that outlives the leader (a stuck
            # scheduler) may hold it open, and must not hide the leader's exit.
            loop = asyncio.get_running_loop()
            read_fd, write_fd = os.pipe()
            try:
                self.proc = self._popen(env, write_fd)
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
            self._forwarder = loop.create_task(self._forward(read_fd), name=f"forward-{self.name}")
        self.started_at = time.monotonic()

    def _popen(self, env: dict[str, str], out: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            env=env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )

    async def _forward(self, read_fd: int) -> None:
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader(limit=_LINE_LIMIT)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(read_fd, "rb", buffering=0)
        )
        try:
            while True:
                try:
                    raw = await stream.readline()
                except ValueError:  # a line longer than the limit: pass on what is buffered
                    raw = await stream.read(_LINE_LIMIT)
                if not raw:
                    return
                # Progress bars redraw with \r; only the last state of the line is worth a log record.
                line = raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
                self.tail.append(line)
                log.info("[%s] %s", self.name, line)
        finally:
            transport.close()

    def output(self) -> str:
        """Everything the process printed to its log file so far ("" without a log file)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def last_lines(self, lines: int = TAIL_LINES) -> str:
        """The last lines the process printed, for error messages."""
        tail = self.output().splitlines()[-lines:] if self.log_path is not None else list(self.tail)[-lines:]
        return "\n".join(tail) or "(no output)"

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the process group; a group that is already gone is fine."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def note_descendants(self) -> None:
        """Remember every process below this one now, so that a stop also ends those that left its group."""
        if self.running:
            self._descendants.update(descendants(self.pid))

    async def wait(self) -> int:
        """Wait, without blocking the event loop, until the process exits; its exit status."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        if self.proc.poll() is None:
            await _exit_of(self.proc)
        return self.proc.wait()

    def wait_blocking(self, timeout: float | None) -> int | None:
        """The exit status after waiting up to `timeout` s in this thread (None: still running)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    async def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the group, SIGKILL it if the process outlives `grace` s, then clear what is left.

        Returns the exit status (None if it was never started). Idempotent.
        """
        if self.proc is None:
            return None
        self.note_descendants()
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.wait(), grace)
            except TimeoutError:
                log.warning("[%s] still running %g s after SIGTERM; sending SIGKILL", self.name, grace)
                self.signal_group(signal.SIGKILL)
                await self.wait()
        await self.clear_group()
        return self.proc.returncode

    def stop_blocking(self, grace: float) -> int | None:
        """`stop` for synchronous code; only for a child that logs to a file."""
        if self.log_path is None:
            raise RuntimeError(f"{self.name} forwards its output on its event loop: stop it there")
        return run_blocking(self.stop(grace))

    async def clear_group(self) -> None:
        """After the leader exited: kill what it left in its group or below it, finish forwarding its output."""
        self.signal_group(signal.SIGKILL)
        for pid, started in self._descendants.items():
            if _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self._descendants.clear()
        if self._forwarder is not None:
            # The pipe reaches EOF once every holder of it is dead; a detached holder must not hang us.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._forwarder), 5.0)
            self._forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._forwarder
            self._forwarder = None


async def _exit_of(proc: subprocess.Popen[bytes]) -> None:
    """Return once `proc` has exited (it is not reaped here)."""
    if not hasattr(os, "pidfd_open"):  # not Linux: look every 0.1 s
        while proc.poll() is None:
            await asyncio.sleep(0.1)
        return
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()
    fd = os.pidfd_open(proc.pid)  # readable once the process has exited

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields else None  # field 22 of proc(5), counted after the command name


def descendants(pid: int) -> dict[int, str]:
    """Every live process below `pid`, as pid -> its start time (a reused pid has another), from /proc.

    Linux only; elsewhere it finds none.
    """
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
                starts[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        below = todo.pop()
        found[below] = starts[below]
        todo += children.get(below, [])
    return found
