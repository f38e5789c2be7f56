"""Profiles: the built-in calibrations, derived adaptive defaults, and overrides from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.profiles import ProfileError, load_profile

CALIBRATION_EXAMPLE = """
name = "field-8gpu"

[plain]
t0_ms = 4.53
per_request_ms = 1.294
tau = 1.0
num_draft_tokens = 1
max_running_requests = 256
prefill_ms_per_token = 0.125
max_total_tokens = 400000     # KV capacity in tokens

[eagle]
t0_ms = 5.82
per_request_ms = 8.47
tau = 3.0
num_draft_tokens = 4
max_running_requests = 48
prefill_ms_per_token = 0.125
max_total_tokens = 200000
"""


def test_field_profile_matches_calibration_checks() -> None:
    p = load_profile("field-8gpu")
    assert p.output_throughput("eagle", 1) / p.output_throughput("plain", 1) == pytest.approx(1.22, abs=0.01)
    assert p.output_throughput("eagle", 2) / p.output_throughput("plain", 2) == pytest.approx(0.94, abs=0.01)
    assert p.output_throughput("eagle", 48) == pytest.approx(349, abs=2)
    assert p.output_throughput("plain", 128) == pytest.approx(752, abs=2)
    assert p.crossover_batch() == 2
    assert p.tpot_s("eagle", 1) == pytest.approx((5.82 + 8.47) / 3 / 1000)


def test_llama_profile_crossover_is_beyond_the_eagle_cap() -> None:
    p = load_profile("llama8b-h100")
    assert p.output_throughput("eagle", 1) / p.output_throughput("plain", 1) == pytest.approx(1.69, abs=0.01)
    assert p.output_throughput("eagle", 64) / p.output_throughput("plain", 64) == pytest.approx(1.3, abs=0.05)
    crossover = p.crossover_batch()
    assert crossover is not None and crossover > p.eagle.max_running_requests


def test_adaptive_defaults_come_from_eagle_and_plain() -> None:
    p = load_profile("field-8gpu")
    a = p.adaptive
    assert (a.t0_ms, a.per_request_ms, a.tau, a.max_total_tokens) == (5.82, 8.47, 3.0, 200000)
    assert (a.plain_t0_ms, a.plain_per_request_ms, a.max_running_requests, a.off_overhead) == (4.53, 1.294, 256, 0.08)
    # Drafting still wins at 2 once the off mode pays its 8%; from 3 on the off mode is faster.
    assert a.adaptive_off_batch == 3
    assert p.output_throughput("adaptive", 2) == pytest.approx(p.output_throughput("eagle", 2))
    assert p.output_throughput("adaptive", 8) == pytest.approx(p.output_throughput("plain", 8) / 1.08)
    # llama8b-h100: drafting pays at every batch up to the raised cap, so it never switches off.
    llama = load_profile("llama8b-h100").adaptive
    assert llama.adaptive_off_batch == llama.max_running_requests + 1


def test_partial_file_overrides_and_adaptive_follows(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\n[eagle]\ntau = 2.0\n[adaptive]\noff_overhead = 0.2\n')
    p = load_profile("field-8gpu", path)
    assert p.name == "mine" and p.eagle.tau == 2.0 and p.eagle.t0_ms == 5.82
    assert p.adaptive.tau == 2.0 and p.adaptive.off_overhead == 0.2
    assert p.adaptive.adaptive_off_batch < 3  # worse acceptance: drafting stops paying sooner


def test_calibration_file_format_loads_from_toml_and_json(tmp_path: Path) -> None:
    toml_path = tmp_path / "field.toml"
    toml_path.write_text(CALIBRATION_EXAMPLE)
    from_toml = load_profile("llama8b-h100", toml_path)
    assert from_toml.eagle.per_request_ms == 8.47 and from_toml.plain.max_total_tokens == 400000
    json_path = tmp_path / "field.json"
    json_path.write_text(json.dumps({"plain": {"t0_ms": 5.0}}))
    assert load_profile("field-8gpu", json_path).plain.t0_ms == 5.0


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[eagle]\ntau = 9.0\n", "tau (9.0) cannot exceed num_draft_tokens"),
        ("[plain]\nno_such_key = 1\n", "plain.no_such_key"),
        ("[plain]\nt0_ms = -1\n", "plain.t0_ms"),
        ("[plain\n", "not valid TOML"),
    ],
)
def test_bad_profile_files_name_the_problem(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ProfileError, match=None) as err:
        load_profile("field-8gpu", path)
    assert needle in str(err.value)


def test_unknown_profile_name() -> None:
    with pytest.raises(ProfileError, match="built-in profiles are field-8gpu, h200-llama8b, llama8b-h100"):
        load_profile("nope")


def test_closed_loop_model_counts_prefill_and_the_cap() -> None:
    p = load_profile("field-8gpu")
    one = p.closed_loop_throughput("plain", 1, 100, 0)
    assert one == pytest.approx(p.output_throughput("plain", 1))
    assert p.closed_loop_throughput("plain", 1, 100, 400) < one  # 400 prompt tokens = 50 ms per request
    assert p.closed_loop_throughput("eagle", 96, 100, 0) == p.closed_loop_throughput("eagle", 48, 100, 0)
