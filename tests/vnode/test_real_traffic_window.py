"""benchmarks/real_traffic.py's trace window (`--trace-requests`): each level offers its rate on the window
it replays, so a longer window is the same load over more of the trace."""

from __future__ import annotations

import pytest

from benchmarks.real_traffic import TRACE, dataset, level_at, trace_rate


@pytest.mark.skipif(not TRACE.exists(), reason="the shared Mooncake trace is not on this machine")
def test_a_level_scales_the_clock_of_the_window_it_replays() -> None:
    short, long = dataset("trace", 16), dataset("trace", 64)
    assert len(short.window()) == 16 and len(long.window()) == 64
    assert trace_rate(short) != trace_rate(long)
    for requests, replay in ((16, short), (64, long)):
        level = level_at("trace", 2.0, requests)
        assert level.trace_time_scale == pytest.approx(trace_rate(replay) / 2.0)
