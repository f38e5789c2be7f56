"""Step-time tables: `step_ms = [[B, ms], ...]` instead of `t0_ms` and `per_request_ms`, everywhere the model is read."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from backends.sim.profiles import ProfileError, load_profile
from backends.sim.stepcurve import StepCurve
from backends.testbed import SimFactory

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_table_is_piecewise_linear_and_extends_with_the_end_slopes() -> None:
    curve = StepCurve.table([[8, 10.0], [16, 12.0], [32, 20.0]])
    assert curve.at(8) == 10.0 and curve.at(12) == pytest.approx(11.0) and curve.at(24) == pytest.approx(16.0)
    assert curve.at(48) == pytest.approx(28.0)  # last segment's 0.5 ms per request, beyond the last point
    assert curve.at(4) == pytest.approx(9.0)  # first segment's 0.25 ms per request, below the first point
    assert curve.at(0) == pytest.approx(8.0)
    steep = StepCurve.table([[10, 4.0], [20, 14.0]])
    assert steep.at(1) == 2.0  # the first slope would give -5: floored at half the smallest point
    assert StepCurve.table([[4, 7.0]]).at(100) == 7.0
    assert StepCurve.line(4.53, 1.294).at(7) == 4.53 + 1.294 * 7


@pytest.mark.parametrize(
    ("plain", "needle"),
    [
        ("step_ms = [[1, 5.0], [8, 6.0]]\nt0_ms = 4.0\n", "not both"),
        ("step_ms = [[8, 5.0], [1, 6.0]]\n", "must increase"),
        ("step_ms = []\n", "at least one"),
        ("step_ms = [[0, 5.0]]\n", "plain.step_ms"),
        ("step_ms = [[1, -5.0]]\n", "plain.step_ms"),
    ],
)
def test_bad_tables_name_the_problem(tmp_path: Path, plain: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"[plain]\n{plain}")
    with pytest.raises(ProfileError) as err:
        load_profile("field-8gpu", path)
    assert needle in str(err.value)


def test_a_file_replaces_the_step_model_in_whichever_form(tmp_path: Path) -> None:
    table = tmp_path / "table.toml"
    table.write_text("[plain]\nstep_ms = [[1, 5.0], [65, 9.0]]\n")
    p = load_profile("field-8gpu", table)
    assert p.plain.t0_ms is None and p.plain.step_ms(33) == pytest.approx(7.0)
    assert p.output_throughput("plain", 33) == pytest.approx(33 * 1000 / 7.0)
    assert p.eagle.step_ms(2) == 5.82 + 8.47 * 2  # the other role keeps its line
    line = tmp_path / "line.toml"
    line.write_text("[eagle]\nt0_ms = 6.0\nper_request_ms = 0.5\n")
    q = load_profile("h200-llama8b", line)
    assert q.eagle.step_table is None and q.eagle.step_ms(10) == 11.0
    half = tmp_path / "half.toml"
    half.write_text("[eagle]\nper_request_ms = 0.5\n")
    with pytest.raises(ProfileError, match="both t0_ms and per_request_ms"):
        load_profile("h200-llama8b", half)


def test_adaptive_role_derives_from_tables(tmp_path: Path) -> None:
    # EAGLE's step grows 0.5 ms per request past 16; off mode (plain * 1.08) pays once 2 * plain * 1.08
    # <= eagle, which the last EAGLE segment extended reaches at 35 (23.40 <= 23.5; at 32, 23.3 > 22).
    path = tmp_path / "bend.toml"
    path.write_text(
        "[plain]\nstep_ms = [[1, 10.0], [64, 11.6]]\n"
        "[eagle]\nstep_ms = [[1, 12.0], [16, 14.0], [32, 22.0]]\ntau = 2.0\n"
    )
    p = load_profile("field-8gpu", path)
    a = p.adaptive
    assert a.step_table == p.eagle.step_table and a.plain_step_table == p.plain.step_table
    expected = next(b for b in range(1, 257) if 2.0 * p.plain.step_ms(b) * 1.08 <= p.eagle.step_ms(b))
    assert a.adaptive_off_batch == expected == 35
    assert p.adaptive.step_ms(expected) == pytest.approx(p.plain.step_ms(expected) * 1.08)
    assert p.adaptive.step_ms(expected - 1) == p.eagle.step_ms(expected - 1)


def test_measured_h200_profile_is_the_raw_measurement() -> None:
    raw = json.loads((REPO_ROOT / "docs/benchmarks/calibration-h200/compiled.json").read_text())
    p = load_profile("h200-llama8b")
    for step in raw["steps"]:
        assert p.plain.step_ms(step["batch"]) == pytest.approx(step["plain_ms"], abs=1e-3)
        assert p.eagle.step_ms(step["batch"]) == pytest.approx(step["eagle_ms"], abs=1e-3)
    assert (p.eagle.tau, p.eagle.num_draft_tokens, p.eagle.max_running_requests) == (3.0, 4, 48)
    # The curves bend: a request costs more step time once compute, not the weight read, binds.
    assert p.plain.step_ms(256) - p.plain.step_ms(128) > 3 * (p.plain.step_ms(32) - p.plain.step_ms(1))


def test_sim_serves_a_table_profile_at_its_step_times(sims: SimFactory, tmp_path: Path) -> None:
    profile = tmp_path / "slow.toml"
    profile.write_text("[plain]\nstep_ms = [[1, 40.0], [8, 60.0]]\n")
    sim = sims.start("--role", "plain", "--profile-file", str(profile))
    info = httpx.get(sim.url() + "/server_info").json()
    assert info["sim"]["profile"]["plain"]["step_ms"] == [[1, 40.0], [8, 60.0]]
    body = {"model": "m", "prompt": "hello", "max_tokens": 20, "ignore_eos": True}
    started = time.monotonic()
    resp = httpx.post(sim.url() + "/v1/completions", json=body, timeout=30)
    elapsed = time.monotonic() - started
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 20
    assert elapsed >= 20 * 0.040 * 0.95  # 20 steps of the table's 40 ms at B=1; never faster than modelled


def test_specgate_sim_names_a_bad_table(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[eagle]\nstep_ms = [[8, 5.0], [4, 6.0]]\n")
    specgate = Path(sys.executable).parent / "specgate"
    done = subprocess.run(
        [str(specgate), "sim", "--role", "eagle", "--port", "0", "--profile-file", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "eagle" in done.stderr and "must increase" in done.stderr
