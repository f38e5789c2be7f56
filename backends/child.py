"""One backend OS process: spawned in its own session, its output forwarded to logging, its
whole process group stopped at the end.

SGLang's launcher forks scheduler and detokenizer processes; they stay in the launcher's process
group, so signalling the group (never just the pid) is what leaves no GPU memory held behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import Callable

from backends.plan import ProcessSpec, redact_argv

log = logging.getLogger("specgate.backend")

_PR_SET_PDEATHSIG = 1
_LINE_LIMIT = 1 << 20  # SGLang prints long lines (server args, tracebacks)
TAIL_LINES = 30


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that asks the kernel to SIGKILL the child when specgate dies.

    PR_SET_PDEATHSIG fires when the thread that forked the child exits; that is the event-loop
    thread, which lives as long as specgate does. Linux only; elsewhere nothing is set.
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
    """One supervised process; `spawn` may be called again after it exited (a restart)."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._forwarder: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        """The process name from the plan (`eagle`, `plain` or `colocated`)."""
        return self.spec.name

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc is not None and self.proc.returncode is None

    async def spawn(self) -> None:
        """Start the process in a new session (its own process group), forwarding its output."""
        log.info("[%s] starting: %s", self.name, " ".join(redact_argv(self.spec.argv)))
        # Our own pipe rather than asyncio's: asyncio's Process.wait() also waits for its pipes to
        # close, and a grandchild that outlives the leader (a stuck scheduler) would hold them open,
        # hiding the exit we must act on.
        read_fd, write_fd = os.pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                env={**os.environ, **self.spec.env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.started_at = asyncio.get_running_loop().time()
        self._forwarder = asyncio.create_task(self._forward(read_fd), name=f"forward-{self.name}")

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

    def last_lines(self) -> str:
        """The last lines the process printed, for error messages."""
        return "\n".join(self.tail) or "(no output)"

    def kill_group(self, sig: signal.Signals) -> None:
        """Send `sig` to the process group; a group that is already gone is fine."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def terminate(self, timeout: float) -> None:
        """SIGTERM the group, wait up to `timeout` for the process, then SIGKILL what is left."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.kill_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                log.warning("[%s] still running %g s after SIGTERM; sending SIGKILL", self.name, timeout)
                self.kill_group(signal.SIGKILL)
                await self.proc.wait()
        await self.clear_group()

    async def clear_group(self) -> None:
        """After the leader exited: kill what it left in its group and finish forwarding its output."""
        self.kill_group(signal.SIGKILL)
        if self._forwarder is not None:
            # The pipe reaches EOF once every holder of it is dead; a detached holder must not hang us.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._forwarder), 5.0)
            self._forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._forwarder
            self._forwarder = None
