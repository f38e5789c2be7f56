"""Run `specgate serve` as a child process for end-to-end tests, and prove it leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_SERVING = re.compile(r"serving on (http://\S+)")


@dataclass
class GatewayProcess:
    """A running `specgate serve`; `output` collects its stdout and stderr lines."""

    proc: subprocess.Popen[str]
    url: str = ""
    output: list[str] = field(default_factory=list)

    def descendants(self) -> list[psutil.Process]:
        """Every live process started below the gateway (backends and their children)."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the gateway only (as an orchestrator would) and wait; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill_group()

    def kill_group(self) -> None:
        """Last-resort cleanup so a failing test never leaks processes."""
        for child in self.descendants():
            child.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def text(self) -> str:
        return "".join(self.output)


def start_gateway(
    *args: str, config: Path | None = None, env: dict[str, str] | None = None, timeout: float = 90.0
) -> GatewayProcess:
    """Start `specgate serve --port 0 ...` and wait for its 'serving on' line."""
    argv = [sys.executable, "-m", "gateway", "serve", "--port", "0", *args]
    if config is not None:
        argv += ["--config", str(config)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own group, so cleanup can reach every descendant
    )
    gw = GatewayProcess(proc)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            gw.output.append(line)
            match = _SERVING.search(line)
            if match and not gw.url:
                gw.url = match.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            break
    if not gw.url:
        gw.kill_group()
        raise RuntimeError(f"specgate serve did not start:\n{gw.text()}")
    return gw
