"""A gateway that starts under load (benchmarks/cold_start.py): a request that finds its group idle speculates
while plain decode is measured, so speculation is taken where it is faster, from a fresh start at half of
plain-dp's capacity and at its peak, and not where it is slower."""

from __future__ import annotations

import dataclasses

from benchmarks.cold_start import cell
from benchmarks.real_traffic import MACHINES, capacity, level_at, settings_for, spec
from vnode.envelope import run_envelope

LLAMA8B_K8 = 1  # benchmarks.real_traffic.MACHINES: llama8b-h100, 8 co-located groups of one GPU
FIELD_K1 = 0  # ... field-8gpu, one co-located pair on 8 GPUs
H200_K8 = 2  # ... h200-llama8b, 8 co-located groups of one GPU
REQUESTS = 1024  # about 10 mean lives at half of plain-dp's capacity


def test_a_gateway_started_under_load_speculates_where_speculation_is_faster() -> None:
    # EAGLE is faster than plain decode at every load of this profile (eagle-dp's TPOT is about 60% of
    # plain-dp's here). From a cold start plain decode is measured one request at a time and a request that
    # finds its group idle speculates, so the groups are on EAGLE before the load fills them; measuring each
    # group's plain server in turn sent 17% of the level plain and its first lives' p99 to 1.56x.
    started = cell(LLAMA8B_K8, "random", 0.5, REQUESTS)
    assert started["targets"]["specgate"]["speculated"] > 0.95
    assert started["ratios"]["e2e_p50_ratio"] < 1.03
    assert started["ratios"]["e2e_p99_ratio"] < 1.15
    assert started["targets"]["specgate"]["failed"] == 0


def test_a_gateway_restarted_at_peak_with_nothing_measured_does_not_pile_requests_onto_eagle() -> None:
    # field-8gpu K=1 at 90% of plain-dp's capacity, no warm-up request: the first request speculates and
    # every later one meets a busy group before either curve is fitted. Past a load of about 2, EAGLE on
    # this profile is many times slower (eagle-dp's E2E p50 here is minutes), so the cold start must
    # decode them plain, as plain-dp does, not join the busy EAGLE server.
    machine = MACHINES[FIELD_K1]
    rate = 0.9 * capacity(machine, "random")
    settings = dataclasses.replace(settings_for("random", (level_at("random", rate),), 1024), warmup=0)
    (level,) = run_envelope(spec(machine, settings)).levels
    specgate, plain = level.targets["specgate"].stats, level.targets["plain-dp"].stats
    assert specgate.failed == 0
    assert specgate.e2e.p50 < 1.1 * plain.e2e.p50
    assert specgate.output_tok_s > 0.97 * plain.output_tok_s


def test_a_gateway_started_at_peak_speculates_where_speculation_is_faster() -> None:
    # h200-llama8b at 90% of plain-dp's capacity: EAGLE is faster at every load here too. The first requests
    # find their groups idle and speculate, EAGLE's curve is read at the load as it fills, and the groups
    # stay on EAGLE; turned plain by EAGLE's prior slope, they would never measure it at this load.
    level = cell(H200_K8, "random", 0.9, REQUESTS)
    assert level["targets"]["specgate"]["speculated"] > 0.85
    assert level["ratios"]["e2e_p50_ratio"] < 1.1
    assert level["targets"]["specgate"]["failed"] == 0


def test_a_gateway_restarted_under_long_prompts_speculates_where_speculation_decodes_them_faster() -> None:
    # h200-llama8b at 90% of plain-dp's capacity on the Mooncake trace's first 512 requests (prompts of about
    # 12,000 tokens that share a block now and then), from a fresh start. EAGLE servers' first tokens come
    # later (their queue for a co-located server's smaller KV share), so priced at each kind's learned
    # prefill cost a prompt of which a plain server held one block was sent there to decode: a quarter of
    # the requests speculated and E2E p50 was 2.0x eagle-dp's. At one price for every server the decode
    # curves choose.
    level = cell(H200_K8, "trace", 0.9, 0)
    assert level["targets"]["specgate"]["failed"] == 0
    assert level["targets"]["specgate"]["speculated"] > 0.6
    assert level["ratios"]["e2e_p50_ratio"] < 1.5
