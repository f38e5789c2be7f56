"""The profile family: each member has the crossover and speed-up it claims; a sample runs end to end."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from backends.sim.profiles import load_profile
from benchmarks.family_realtime import FamilyCell, envelope_args
from loadtest.workloads.lengths import LengthDist
from vnode.cli import main
from vnode.family import BASE_PROFILE, CROSSOVERS, GROUPS, Member, family, members
from vnode.family_sweep import WORKLOADS, Scale, cell_document, plain_capacity


def test_every_member_has_the_crossover_and_speedup_it_claims() -> None:
    grid = members()
    assert len(grid) == 240 and len({m.name for m in grid}) == 240
    for member in grid:
        profile = member.profile()
        alone = profile.output_throughput("eagle", 1) / profile.output_throughput("plain", 1)
        assert profile.crossover_batch() == member.crossover, member.name
        assert alone == pytest.approx(member.speedup, rel=1e-9), member.name
        assert profile.eagle.max_running_requests == 48 and profile.eagle.tau == 3.0  # the base's cap; tau 3
    assert {m.crossover for m in grid} == set(CROSSOVERS) and {m.groups for m in grid} == set(GROUPS)


def test_a_member_is_its_profile_file_over_the_base(tmp_path: Path) -> None:
    for member in (Member(16, 2.0, "line", 2), Member(4, 1.5, "table", 8)):
        from_file = load_profile(BASE_PROFILE, member.write(tmp_path))
        assert from_file == member.profile() and from_file.name == member.name
        assert (from_file.eagle.step_table is None) == (member.curve == "line")
        assert Member.parse(member.name) == member


@pytest.mark.parametrize("name", ["x2-s2-line-k2", "x1-s1.5-line-k1", "x4-s0.9-line-k1", "x16-s2-curvy-k2", "16-2-line-2"])
def test_a_member_that_cannot_exist_or_is_misnamed_is_refused(name: str) -> None:
    with pytest.raises(ValueError):
        Member.parse(name)


def test_the_default_family_covers_every_axis() -> None:
    chosen = family()
    assert {m.crossover for m in chosen} == set(CROSSOVERS) and {m.groups for m in chosen} == set(GROUPS)
    assert {m.curve for m in chosen} == {"line", "table"} and {1.2, 1.5, 2.0, 3.0} <= {m.speedup for m in chosen}


def test_plain_capacity_is_k_saturated_plain_servers() -> None:
    profile = Member(16, 2.0, "line", 2).profile()
    one = plain_capacity(profile, 1, LengthDist(), Scale())
    assert plain_capacity(profile, 4, LengthDist(), Scale()) == pytest.approx(4 * one)
    step = profile.plain.step_ms(256) + profile.plain.prefill_ms_per_token * (128 + 7) * 256 / 64  # per decode step
    assert one == pytest.approx(256 * 1000.0 / (64 * step))


TINY = Scale(input_len=32, output_len=8, closed_per_slot=1, closed_min=4, open_requests=24, step_requests=40)


@pytest.mark.parametrize("member", [Member(8, 2.0, "line", 1), Member(32, 1.5, "table", 2)], ids=lambda m: m.name)
def test_a_sample_of_the_family_runs_every_workload_end_to_end(member: Member) -> None:
    for name, workload in WORKLOADS.items():
        doc = cell_document(member, workload, TINY)
        assert doc.envelope is not None and {c.name for c in doc.envelope.checks} == {b.name for b in workload.bounds}
        for level in doc.levels:
            assert list(level.targets) == ["plain-dp", "eagle-dp", "adaptive-dp", "specgate"], name
            for target, result in level.targets.items():
                stats = result.stats
                assert stats.failed == 0 and stats.completed == level.requests, (name, level.label, target)
                assert all(math.isfinite(v) for v in (stats.output_tok_s, stats.ttft.p50, stats.e2e.p99)), (name, target)
            ratios = [v for k, v in level.ratios.items() if k.endswith("ratio")]
            assert ratios and all(v is not None and math.isfinite(v) and v > 0 for v in ratios), (name, level.label)


def test_the_family_command_prints_each_cell_and_writes_its_checks(tmp_path: Path) -> None:
    out, markdown = tmp_path / "family.json", tmp_path / "family.md"
    result = CliRunner().invoke(main, ["family", "--members", "x8-s2-line-k1", "--workloads", "step", "--jobs", "1",
                                       "--output-len", "8", "--out", str(out), "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    assert "x8-s2-line-k1" in result.output and "1 members x 1 workloads" in result.output
    cells = orjson.loads(out.read_bytes())["cells"]
    assert [(c["member"], c["workload"]) for c in cells] == [("x8-s2-line-k1", "step")]
    assert {c["name"] for c in cells[0]["checks"]} == {"e2e_p50_ratio", "e2e_p99_ratio", "failed_requests"}
    report = markdown.read_text()
    assert "python -m vnode family --members x8-s2-line-k1 --workloads step" in report
    verdict = "of 1 |" in report and ("| step | 1 of 1 |" in report) == (not any(not c["met"] for c in cells[0]["checks"]))
    assert verdict and "| x8-s2-line-k1 |" in report


@pytest.mark.parametrize("name", ["x4-s2-line-k1:poisson", "x16-s2-line-k2:step", "x8-s1.5-line-k2:closed-lognormal"])
def test_the_envelope_command_runs_a_family_cell_as_the_family_does(name: str, tmp_path: Path) -> None:
    """benchmarks/family_realtime.py runs a cell in real time with these arguments: in vnode, with each
    request's own draws (the family's), they give the family's checks exactly."""
    cell = FamilyCell.parse(name)
    args = envelope_args(cell.member, cell.workload, tmp_path)
    CliRunner().invoke(main, ["envelope", *args, "--draws", "request", "--out", str(tmp_path / "out")])
    written = orjson.loads((tmp_path / "out" / "results.json").read_bytes())["envelope"]["checks"]
    family_checks = cell_document(cell.member, cell.workload).envelope.checks  # type: ignore[union-attr]
    by_name = {c["name"]: (c["met"], c["worst"]) for c in written}
    assert {c.name: (c.met, c.worst) for c in family_checks} == {c.name: by_name[c.name] for c in family_checks}
