"""Start and stop a `python -m backends.sim` process for the simulator benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_sim_process(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start a sim with `args` (plus a free `--port`) in its own session; its base URL once /ready is 200."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backends.sim", *args, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.05)
    stop_sim(proc)
    raise RuntimeError(f"sim did not come up:\n{log.read_text()}")


def stop_sim(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the sim's process group; SIGKILL it if it has not exited within 15 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
