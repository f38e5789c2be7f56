"""The access log: one JSON line per proxied request, written by a thread of its own.

The event loop puts a request's fields on a queue as one tuple (`record`: a C call, no encoding);
the writer thread turns whatever has queued up into JSON lines and writes them at once to its sink
(stdout, or a file rotated by size: log_file.py). A full queue (a sink slower than the traffic)
drops lines rather than memory; `dropped` counts them. `close` writes what is left first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import UTC, datetime

import orjson

from gateway.config import LoggingConfig
from gateway.telemetry.log_file import Descriptor, RotatingFile, Sink

log = logging.getLogger("specgate.access_log")

# A line's keys, in the order `record` takes their values. time: the request's arrival (RFC 3339, UTC);
# route: the path the client called; rule: the routing rule that chose the backend; mode: eagle or plain.
FIELDS = (
    "time", "request_id", "trace_id", "tenant", "route", "model", "backend", "group", "mode", "tier", "rule", "status",
    "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "e2e_ms", "failover", "client_gone", "error",
)
_MAX_QUEUED = 100_000
_BATCH = 4096  # lines encoded and written per wake-up, at most
_STOP = object()


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
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.dropped = 0
        self._writer = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._writer.start()

    def record(self, values: tuple[object, ...]) -> None:
        """Log one request: `values` in `FIELDS` order, its time as seconds since the epoch."""
        if self._queue.qsize() >= _MAX_QUEUED:
            self.dropped += 1
            return
        self._queue.put(values)

    def close(self) -> None:
        """Write every line recorded so far and stop the writer (blocks: call it off the event loop)."""
        self._queue.put(_STOP)
        self._writer.join()
        self._sink.close()

    def _run(self) -> None:
        failing = False
        while True:
            batch = [self._queue.get()]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines = [orjson.dumps(dict(zip(FIELDS, _timed(v), strict=True))) for v in batch if v is not _STOP]
            try:
                if lines:
                    self._sink.write(b"\n".join(lines) + b"\n")
                failing = False
            except OSError as exc:
                if not failing:  # once per failing stretch, not once per line
                    log.warning("access log lines lost: %s", exc)
                failing = True
            if batch[-1] is _STOP:
                return


def _timed(values: object) -> tuple[object, ...]:
    """`values` with its first one, seconds since the epoch, as RFC 3339 UTC to the millisecond."""
    at, *rest = values  # type: ignore[misc]
    stamp = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return (stamp, *rest)


def epoch(monotonic: float) -> float:
    """A `time.monotonic()` reading as seconds since the epoch."""
    return time.time() - (time.monotonic() - monotonic)
