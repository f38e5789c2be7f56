"""A gateway that starts under load (benchmarks/cold_start.py): EAGLE, measured on lone requests only, is
tried at the load the groups carry (a reach trial) and taken where it is faster there."""

from __future__ import annotations

import math

import pytest

import gateway.policies.adaptive.policy as adaptive
from benchmarks.cold_start import cell

LLAMA8B_K8 = 1  # benchmarks.real_traffic.MACHINES: llama8b-h100, 8 co-located groups of one GPU
REQUESTS = 1024  # about 10 mean lives at half of plain-dp's capacity: the trial comes after 4


def test_a_gateway_started_under_load_tries_speculation_there_and_keeps_it_where_it_is_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried = cell(LLAMA8B_K8, "random", 0.5, REQUESTS)
    monkeypatch.setattr(adaptive, "TRIAL_LIVES", math.inf)
    never = cell(LLAMA8B_K8, "random", 0.5, REQUESTS)
    # EAGLE is faster than plain decode at every load of this profile (eagle-dp's TPOT is about 60% of
    # plain-dp's here); without a trial the groups stay plain for the whole level.
    assert never["targets"]["specgate"]["speculated"] < 0.1
    assert tried["targets"]["specgate"]["speculated"] > 0.4
    assert tried["ratios"]["throughput_ratio"] > never["ratios"]["throughput_ratio"]
    assert tried["ratios"]["e2e_p50_ratio"] < never["ratios"]["e2e_p50_ratio"]
    assert tried["targets"]["specgate"]["failed"] == 0
