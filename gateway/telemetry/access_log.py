"""The access log: one JSON line per proxied request, written by a thread of its own.

The event loop appends a request's fields to a deque as one tuple (`record`: no encoding, and no
wake-up of another thread: one per request cost more than the line); the writer thread wakes every
`FLUSH_SECONDS`, turns what has queued up into JSON lines and writes them at once to its sink
(stdout, or a file rotated by size: log_file.py). A full queue (a sink slower than the traffic)
drops lines rather than memory; `dropped` counts them. `close` writes what is left first.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.config import LoggingConfig
from gateway.telemetry.log_file import Descriptor, RotatingFile, Sink
from gateway.telemetry.outcome import Outcome

log = logging.getLogger("specgate.access_log")

# A line's keys. time: the request's arrival (RFC 3339, UTC); route: the path the client called; rule:
# the routing rule that chose the backend; mode: eagle or plain; cached_tokens: SGLang's
# usage.prompt_tokens_details.cached_tokens (with --enable-cache-report), else 0.
FIELDS = (
    "time", "request_id", "trace_id", "tenant", "route", "model", "backend", "group", "mode", "tier", "rule", "status",
    "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "e2e_ms", "failover", "client_gone", "error",
)
FLUSH_SECONDS = 0.1  # how long a line may wait for the writer
_MAX_QUEUED = 100_000


def sink_for(config: LoggingConfig) -> Sink | None:
    """Where `[logging] access_log` sends the lines; None when it is "off"."""
    if config.access_log == "off":
        return None
    if config.access_log == "stdout":
        return Descriptor(1)
    return RotatingFile(config.access_log, config.access_log_max_bytes, config.access_log_backups)


class AccessLog:
    """Lines to `sink`, from any thread's `record` to the writer thread."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._queue: deque[tuple[Any, ...]] = deque()  # appended and popped atomically, from any thread
        self.dropped = 0
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._writer.start()

    def record(self, values: tuple[Any, ...]) -> None:
        """Log one request: `values` as `Line` takes them (unformatted: the writer formats them)."""
        if len(self._queue) >= _MAX_QUEUED:
            self.dropped += 1
            return
        self._queue.append(values)

    def close(self) -> None:
        """Write every line recorded so far and stop the writer (blocks: call it off the event loop)."""
        self._stop.set()
        self._writer.join()
        self._sink.close()

    def _run(self) -> None:
        failing, line = False, Line()
        while True:
            stopping = self._stop.wait(FLUSH_SECONDS)
            lines = []
            while self._queue:
                lines.append(orjson.dumps(line(*self._queue.popleft())))
            try:
                if lines:
                    self._sink.write(b"\n".join(lines) + b"\n")
                failing = False
            except OSError as exc:
                if not failing:  # once per failing stretch, not once per line
                    log.warning("access log lines lost: %s", exc)
                failing = True
            if stopping:
                return


class Line:
    """One request's values as its line's fields (in the writer: the event loop only gathered them)."""

    def __init__(self) -> None:
        self._second, self._prefix = -1, ""  # the date and time, formatted once a second

    def __call__(self, arrived: float, e2e: float, arrived_at: float, request_id: str, trace_id: int | None,
                 tenant: str | None, route: str, model: str | None, tier: str, o: Outcome) -> dict[str, Any]:
        """`arrived`: seconds since the epoch; `e2e`: seconds it took; `arrived_at`: its time.monotonic()."""
        second = int(arrived)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        usage = o.usage
        details = usage.get("prompt_tokens_details") if usage else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return {
            "time": f"{self._prefix}.{int((arrived - second) * 1000):03d}Z",
            "request_id": request_id,
            "trace_id": None if trace_id is None else f"{trace_id:032x}",
            "tenant": tenant, "route": route, "model": model, "backend": o.backend, "group": o.group,
            "mode": None if o.speculative is None else ("eagle" if o.speculative else "plain"),
            "tier": tier, "rule": o.rule, "status": o.status,
            "prompt_tokens": usage.get("prompt_tokens") if usage else None,
            "cached_tokens": (cached or 0) if usage else None,
            "completion_tokens": usage.get("completion_tokens") if usage else None,
            "ttft_ms": None if o.first_token_at is None else round((o.first_token_at - arrived_at) * 1e3, 3),
            "e2e_ms": round(e2e * 1e3, 3),
            "failover": o.failover, "client_gone": o.client_gone, "error": o.error,
        }
