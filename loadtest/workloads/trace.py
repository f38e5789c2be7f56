"""The `trace` dataset: a Mooncake request trace replayed on its own schedule.

Mooncake's JSONL (kvcache-ai/Mooncake, FAST'25): one request a line, `timestamp` (ms from the
trace's start), `input_length` and `output_length` (tokens) and `hash_ids`, the prompt's blocks
of 512 tokens: equal ids are equal text. A block's text is made from its id (`Words`: equal ids
give equal tokens under tokencount's rule), the last block cut or padded so the prompt is exactly
`input_length` tokens. A window (`start_ms`, `duration_ms`, `num_requests`) picks the requests;
each level replays them at its time scale (0.5: twice as fast) from the window's first request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson

from loadtest.workloads.level import Draw
from loadtest.workloads.plan import Plan, Session, Turn
from loadtest.workloads.text import Words

BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def prompt(self, draw: Draw) -> tuple[Words, ...]:
        """The prompt's blocks: 512 tokens each, the last one whatever `input_length` leaves."""
        blocks = []
        left = self.input_length
        for i, block in enumerate(self.hash_ids):
            count = left if i == len(self.hash_ids) - 1 else min(BLOCK_TOKENS, left)
            if count <= 0:
                break
            blocks.append(Words(draw.key(f"block{block}"), count))
            left -= count
        return tuple(blocks)


def read_trace(path: Path) -> tuple[TraceRequest, ...]:
    """Every request of a trace file, in arrival order (raises TraceError naming the bad line)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    requests = [_parse(line, path, number) for number, line in enumerate(lines, start=1) if line.strip()]
    if not requests:
        raise TraceError(f"trace {path} holds no request")
    return tuple(sorted(requests, key=lambda r: r.timestamp_ms))


def _parse(line: bytes, path: Path, number: int) -> TraceRequest:
    where = f"trace {path} line {number}"
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in raw]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    stamp = raw["timestamp"]
    if not isinstance(stamp, int | float) or isinstance(stamp, bool) or not 0 <= stamp < math.inf:
        raise TraceError(f"{where}: timestamp must be a non-negative number of ms, got {stamp!r}")
    for key in ("input_length", "output_length"):
        if not _whole(raw[key], 1):
            raise TraceError(f"{where}: {key} must be an integer of at least 1, got {raw[key]!r}")
    ids = raw["hash_ids"]
    if not isinstance(ids, list) or not ids or not all(_whole(i, 0) for i in ids):
        raise TraceError(f"{where}: hash_ids must be a non-empty list of non-negative integers, got {ids!r:.80}")
    return TraceRequest(stamp, raw["input_length"], raw["output_length"], tuple(ids))


def _whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True)
class TraceReplay:
    """A window of a trace: from `start_ms`, for `duration_ms` (None: to the end), at most `num_requests`."""

    name: ClassVar[str] = "trace"

    path: Path
    requests: tuple[TraceRequest, ...] = field(repr=False)
    start_ms: int = 0
    duration_ms: int | None = None
    num_requests: int | None = None

    @classmethod
    def load(
        cls, path: Path, start_ms: int = 0, duration_ms: int | None = None, num_requests: int | None = None
    ) -> TraceReplay:
        """Read `path` and choose the window (raises TraceError for a bad file or an empty window)."""
        replay = cls(path, read_trace(path), start_ms, duration_ms, num_requests)
        if not replay.window():
            raise TraceError(f"trace {path} has no request in the window from {start_ms} ms"
                             + (f" for {duration_ms} ms" if duration_ms is not None else ""))
        return replay

    def window(self) -> tuple[TraceRequest, ...]:
        """The requests the window holds, in arrival order."""
        end = math.inf if self.duration_ms is None else self.start_ms + self.duration_ms
        chosen = tuple(r for r in self.requests if self.start_ms <= r.timestamp_ms < end)
        return chosen[: self.num_requests] if self.num_requests is not None else chosen

    def plan(self, draw: Draw) -> Plan:
        """The level's plan: the window's requests at their times (from its first), scaled by the level's factor.

        It offers (requests - 1) / (the last arrival's offset) requests per second.
        """
        scale = draw.level.trace_time_scale
        if scale is None:
            raise ValueError(f"a trace is replayed at a time scale, not at {draw.level.label}")
        window = self.window()
        first = window[0].timestamp_ms
        sessions = tuple(
            Session((Turn(r.prompt(draw), r.output_length),), start_s=(r.timestamp_ms - first) / 1000.0 * scale)
            for r in window
        )
        span = sessions[-1].start_s
        return Plan(sessions, offered_request_s=(len(sessions) - 1) / span if span > 0 else math.inf)

    def settings(self) -> dict[str, Any]:
        """The dataset's options, for results.json."""
        return {"name": self.name, "trace": str(self.path), "trace_start_ms": self.start_ms,
                "trace_duration_ms": self.duration_ms, "num_requests": self.num_requests}
