"""The real-traffic static ceiling: specgate's own servers run with a fixed mode per group behind the baselines'
routers (SMG's cache_aware among them, over the pinned servers only), each level judged by the matrix's bounds."""

from __future__ import annotations

import pytest

from benchmarks.real_traffic import TRACE
from benchmarks.real_traffic_ceiling import ceiling_cell, markdown
from loadtest.envelope.fair import Hardware
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings
from loadtest.workloads.multi_turn import MultiTurn
from vnode.ceiling import Static, static_levels, subject_target
from vnode.envelope import EnvelopeSpec, run_envelope

FIELD_K1 = 0  # benchmarks.real_traffic.MACHINES: field-8gpu, one co-located pair on 8 GPUs


def test_plain_behind_a_pinned_smg_keeps_conversations_where_their_prefix_lives() -> None:
    """Four pairs decoding plain: behind SMG a conversation's turns find their history cached far more often
    than behind the least-in-flight balancer, which spreads them over the four plain servers, and about as often
    as behind SMG over plain-dp's four whole-GPU servers."""
    settings = SweepSettings(levels=(Level(request_rate=6.0),), requests_per_level=RequestsPerLevel(96, False, 96),
                             input_len=64, output_len=32, dataset=MultiTurn(turns=4))
    spec = EnvelopeSpec(Hardware(4, 1), settings, profile="llama8b-h100", routers=("least-inflight", "smg"),
                        draws="request")
    doc = run_envelope(spec)
    subject = subject_target(spec, doc)
    hits = {}
    for static in (Static("plain"), Static("plain", "smg")):
        (level,) = static_levels(subject, settings, static, spec.smg)
        stats = level.targets["specgate"].stats
        assert stats.completed == 96 and stats.failed == 0
        assert all(name.endswith("-plain") for name in stats.backend_share)
        assert stats.traffic is not None
        hits[static.label] = stats.traffic.cache_hit_rate
    assert hits["plain+smg"] > hits["plain"] + 0.1
    baseline = doc.levels[0].targets["plain-dp+smg"].stats.traffic
    assert baseline is not None and hits["plain+smg"] == pytest.approx(baseline.cache_hit_rate, abs=0.03)


@pytest.mark.skipif(not TRACE.exists(), reason="the shared Mooncake trace is not on this machine")
def test_the_field_trace_s_peak_is_out_of_reach_of_the_even_split() -> None:
    """field-8gpu's trace at 90%: every request decodes plain, so specgate's own plain server alone is what it
    ran, and its KV share at the even split misses TTFT p50 as specgate does; with EAGLE at 0.3 of the room
    the plain server alone meets the level."""
    even = ceiling_cell(FIELD_K1, "trace", 0)
    peak = even["levels"][-1]
    assert even["verdict"] == "layout" and peak["load"] == 0.9 and peak["met_by"] == []
    assert peak["ratios"]["plain"]["ttft_p50_ratio"] > 1.15
    assert peak["ratios"]["plain"]["ttft_p50_ratio"] == pytest.approx(peak["ratios"]["specgate"]["ttft_p50_ratio"], rel=0.03)
    assert all(lv["met_by"] for lv in even["levels"][:-1])

    plainward = ceiling_cell(FIELD_K1, "trace", 0, eagle_kv_share=0.3)
    assert "plain" in plainward["levels"][-1]["met_by"]

    report = markdown({"command": "python benchmarks/real_traffic_ceiling.py --machines 0 --workloads trace",
                       "seconds": 1.0, "raw": "x.json", "cells": [even, plainward]})
    assert "| layout | 1 |" in report and "- field-8gpu K=1, trace, seed 0 (layout): 90%: none (specgate: ttft_p50" in report
