"""The access log: one JSON line per proxied request, written by a thread of its own.

The event loop appends a request's values to a deque as one tuple (`record`: no encoding, and no
wake-up of another thread: one per request cost more than the line); the writer thread wakes every
`FLUSH_SECONDS`, encodes what has queued up into JSON lines, in order, and writes them at once to its
sink (stdout, or a file rotated by size: log_file.py). A full queue (a sink slower than the traffic)
drops lines rather than memory; `dropped` counts them. `close` writes what is left first.
"""

from __future__ import annotations

import logging
import threading
import time
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
    "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "e2e_ms", "failover", "moved_from",
    "client_gone", "error",
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
        """Log one request: `values` as `Line` takes them after its first (unformatted: the writer formats them)."""
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
        failing, line, queue = False, Line(), self._queue
        while True:
            stopping = self._stop.wait(FLUSH_SECONDS)
            # The clocks' offset once a batch: the loop noted only time.monotonic() (a line's time moves
            # by what the wall clock was stepped within FLUSH_SECONDS, at most).
            epoch = time.time() - time.monotonic()
            lines = [line(epoch, *queue.popleft()) for _ in range(len(queue))]
            try:
                if lines:
                    self._sink.write(b"".join(lines))
                failing = False
            except OSError as exc:
                if not failing:  # once per failing stretch, not once per line
                    log.warning("access log lines lost: %s", exc)
                failing = True
            if stopping:
                return


class Line:
    """One request's values as its JSON line (in the writer: the event loop only gathered them).

    One dict in `FIELDS` order and one orjson call, each value made by the cheapest exact operation
    (measured: formatting the time's milliseconds, `round` and f-strings cost more than the dict and
    its encoding together).
    """

    def __init__(self) -> None:
        self._second, self._prefix = -1, ""  # the date and time, formatted once a second

    def __call__(self, epoch: float, ended_at: float, arrived_at: float, request_id: str, trace_id: int | None,
                 tenant: str | None, route: str, model: str | None, tier: str, o: Outcome) -> bytes:
        """The line, newline included. `epoch`: time.time() - time.monotonic(); `ended_at` and
        `arrived_at`: the request's time.monotonic() at its end and its arrival."""
        arrived = epoch + arrived_at
        second = int(arrived)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        usage = o.usage
        if usage:
            details = usage.get("prompt_tokens_details")
            cached = (details.get("cached_tokens") if isinstance(details, dict) else None) or 0
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        else:
            prompt = cached = completion = None
        first = o.first_token_at
        return orjson.dumps({
            "time": self._prefix + _MILLIS[int((arrived - second) * 1000)],
            "request_id": request_id,
            "trace_id": None if trace_id is None else "%032x" % trace_id,
            "tenant": tenant, "route": route, "model": model, "backend": o.backend, "group": o.group,
            "mode": _MODE[o.speculative], "tier": tier, "rule": o.rule, "status": o.status,
            "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion,
            "ttft_ms": None if first is None else _ms(first - arrived_at),
            "e2e_ms": _ms(ended_at - arrived_at),
            "failover": o.failover, "moved_from": o.moved_from, "client_gone": o.client_gone, "error": o.error,
        }, option=orjson.OPT_APPEND_NEWLINE)


_MODE = {None: None, True: "eagle", False: "plain"}
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))  # the time's end, by its milliseconds


def _ms(seconds: float) -> float:
    """`seconds` in milliseconds to the microsecond (a float that prints with at most 3 decimals)."""
    return int(seconds * 1e6 + 0.5) / 1e3
