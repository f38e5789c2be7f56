"""Mooncake trace replay: equal block ids are equal text, prompts are exactly input_length tokens,
the window and the time scale shape the schedule, and a bad file is refused naming the line."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadtest.workloads.level import Level
from loadtest.workloads.text import render
from loadtest.workloads.trace import BLOCK_TOKENS, TraceError, TraceReplay, read_trace
from loadtest.workloads.workload import Workload
from tokencount import count_tokens

MOONCAKE = Path("/work/shared/traces/mooncake-conversation.jsonl")
LINES = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 700, "output_length": 6, "hash_ids": [0, 3]},
    {"timestamp": 1000, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 4]},  # padded: 3 ids, 1500 tokens
    {"timestamp": 3000, "input_length": 300, "output_length": 8, "hash_ids": [0, 1, 5]},  # cut to its first block
]


def write(tmp_path: Path, lines: Sequence[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def prompts(replay: TraceReplay, scale: float = 1.0, index: int = 0) -> list[str]:
    plan = Workload(dataset=replay).plan(Level(trace_time_scale=scale), index)
    return [s.request(0, []).prompt for s in plan.sessions]


def test_equal_hash_ids_give_equal_blocks_and_prompts_are_exactly_input_length(tmp_path: Path) -> None:
    replay = TraceReplay.load(write(tmp_path, LINES))
    texts = prompts(replay)
    assert [count_tokens(t) for t in texts] == [1100, 700, 1500, 300]
    words = [t.split() for t in texts]
    # Requests 0 and 2 share blocks 0 and 1: their first 1024 tokens are equal, then they differ.
    assert words[0][: 2 * BLOCK_TOKENS] == words[2][: 2 * BLOCK_TOKENS]
    assert words[0][2 * BLOCK_TOKENS:] != words[2][2 * BLOCK_TOKENS: 1100]
    # Request 1 shares only block 0 with them.
    assert words[1][:BLOCK_TOKENS] == words[0][:BLOCK_TOKENS] and words[1][BLOCK_TOKENS:] != words[0][BLOCK_TOKENS:700]
    # A cut block is the start of the same block elsewhere.
    assert words[3] == words[0][:300]


def test_every_level_gets_its_own_text_and_every_target_the_same(tmp_path: Path) -> None:
    replay = TraceReplay.load(write(tmp_path, LINES))
    assert prompts(replay, index=0) == prompts(replay, index=0)
    assert prompts(replay, index=0)[0] != prompts(replay, index=1)[0]  # no prefix cached from an earlier level


def test_the_schedule_follows_the_trace_at_the_level_time_scale(tmp_path: Path) -> None:
    replay = TraceReplay.load(write(tmp_path, LINES))
    for scale in (1.0, 0.5):
        plan = Workload(dataset=replay).plan(Level(trace_time_scale=scale), 0)
        assert [s.start_s for s in plan.sessions] == pytest.approx([0.0, 0.0, 1.0 * scale, 3.0 * scale])
        assert [s.turns[0].output_len for s in plan.sessions] == [5, 6, 7, 8]
        assert plan.concurrency is None and plan.offered_request_s == pytest.approx(3 / (3.0 * scale))


def test_a_window_picks_requests_by_time_and_count(tmp_path: Path) -> None:
    path = write(tmp_path, LINES)
    window = TraceReplay.load(path, start_ms=500).window()
    assert [r.timestamp_ms for r in window] == [1000, 3000]
    assert [r.timestamp_ms for r in TraceReplay.load(path, duration_ms=1001).window()] == [0, 0, 1000]
    assert len(TraceReplay.load(path, num_requests=2).window()) == 2
    plan = Workload(dataset=TraceReplay.load(path, start_ms=500)).plan(Level(trace_time_scale=1.0), 0)
    assert [s.start_s for s in plan.sessions] == [0.0, 2.0]  # from the window's first request
    with pytest.raises(TraceError, match="no request in the window"):
        TraceReplay.load(path, start_ms=5000)


def test_one_request_at_a_time_offers_an_infinite_rate(tmp_path: Path) -> None:
    plan = Workload(dataset=TraceReplay.load(write(tmp_path, LINES), num_requests=2)).plan(Level(trace_time_scale=1.0), 0)
    assert plan.offered_request_s == math.inf


@pytest.mark.parametrize("line, error", [
    ("{not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
    (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 5}), "line 2: missing hash_ids"),
    (json.dumps({"input_length": 5, "hash_ids": [1]}), "line 2: missing timestamp, output_length"),
    (json.dumps({"timestamp": -1, "input_length": 5, "output_length": 5, "hash_ids": [1]}), "line 2: timestamp"),
    (json.dumps({"timestamp": 0, "input_length": -5, "output_length": 5, "hash_ids": [1]}), "line 2: input_length"),
    (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}), "line 2: output_length"),
    (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [-1]}), "line 2: hash_ids"),
    (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": []}), "line 2: hash_ids"),
])
def test_a_bad_line_is_refused_naming_it(tmp_path: Path, line: str, error: str) -> None:
    path = write(tmp_path, [LINES[0], line, LINES[1]])
    with pytest.raises(TraceError, match=error) as info:
        read_trace(path)
    assert str(path) in str(info.value)


def test_an_empty_or_missing_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="holds no request"):
        read_trace(write(tmp_path, [""]))
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "absent.jsonl")


@pytest.mark.skipif(not MOONCAKE.exists(), reason="the shared Mooncake trace is not on this machine")
def test_the_mooncake_conversation_trace_replays() -> None:
    replay = TraceReplay.load(MOONCAKE, num_requests=12)
    plan = Workload(dataset=replay).plan(Level(trace_time_scale=0.5), 0)
    assert plan.requests == 12 and plan.sessions[-1].start_s == pytest.approx(1.5)  # the 12th request is at 3000 ms
    texts = [render(s.turns[0].user) for s in plan.sessions]
    assert [count_tokens(t) for t in texts] == [r.input_length for r in replay.window()]
    assert len({tuple(t.split()[:BLOCK_TOKENS]) for t in texts}) == 1  # every request starts with block 0
