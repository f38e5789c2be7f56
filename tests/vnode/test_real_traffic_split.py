"""benchmarks/real_traffic.py's `--eagle-kv-share`: specgate's co-located groups split their KV room as given
(the splits `specgate plan` tries), the baselines untouched. On field-8gpu's trace every request decodes plain,
so the EAGLE server's room is idle and the plain server's decides how long prompts queue for their first token.
Results go to `--out` as given, a dot in the name kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks.real_traffic import MACHINES, TRACE, capacity, hardware, level_at, outputs, settings_for, spec
from loadtest.envelope.fair import Hardware
from vnode.envelope import run_envelope

FIELD_K1 = 0  # benchmarks.real_traffic.MACHINES: field-8gpu, one co-located pair on 8 GPUs


def test_a_machine_without_a_share_runs_the_launchers_split() -> None:
    assert hardware(MACHINES[FIELD_K1]) == Hardware(1, 8)


def test_a_share_moves_memory_between_the_servers_of_a_group_and_keeps_their_total() -> None:
    machine = MACHINES[FIELD_K1]
    even, plainward = (hardware(dataclasses.replace(machine, eagle_kv_share=s)) for s in (0.5, 0.3))
    assert even.eagle_mem_fraction is not None and even.plain_mem_fraction is not None
    assert plainward.eagle_mem_fraction is not None and plainward.plain_mem_fraction is not None
    assert plainward.plain_mem_fraction > even.plain_mem_fraction + 0.05
    assert plainward.eagle_mem_fraction + plainward.plain_mem_fraction == pytest.approx(
        even.eagle_mem_fraction + even.plain_mem_fraction, abs=0.002)


@pytest.mark.skipif(not TRACE.exists(), reason="the shared Mooncake trace is not on this machine")
def test_the_plain_server_s_room_decides_the_field_trace_s_first_tokens_at_peak() -> None:
    # 90% of plain-dp's capacity: plain-dp holds about 400,000 tokens on the node, specgate's plain server
    # 146,000 at the even split and 204,000 with EAGLE at 0.3 of the room; its prompts average 12,000.
    machine = MACHINES[FIELD_K1]
    settings = settings_for("trace", (level_at("trace", 0.9 * capacity(machine, "trace")),), 128)

    def ttft_ratio(share: float | None) -> float:
        (level,) = run_envelope(spec(dataclasses.replace(machine, eagle_kv_share=share), settings)).levels
        specgate, plain = level.targets["specgate"].stats, level.targets["plain-dp"].stats
        assert specgate.failed == 0
        assert level.targets["specgate"].stats.backend_share == {"plain": 1.0}
        assert specgate.ttft.p50 is not None and plain.ttft.p50 is not None
        return specgate.ttft.p50 / plain.ttft.p50

    even, plainward = ttft_ratio(None), ttft_ratio(0.3)
    assert even > 1.15
    assert plainward < 1.10


def test_an_output_name_with_a_dot_keeps_it() -> None:
    assert outputs(Path("docs/field-kv0.3")) == (Path("docs/field-kv0.3.json"), Path("docs/field-kv0.3.md"))
    assert outputs(Path("docs/real-traffic.json")) == (Path("docs/real-traffic.json"), Path("docs/real-traffic.md"))
