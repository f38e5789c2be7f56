"""The what-if of a policy that starts knowing its servers' curves (`GatewayRouter.teach`, `--taught`)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from loadtest.envelope.fair import Hardware
from vnode.cli import main
from vnode.envelope import CHAT_TEMPLATE_TOKENS, QuietProgress
from vnode.events import EventQueue
from vnode.family import BASE_PROFILE, Member
from vnode.family_sweep import WORKLOADS, Scale
from vnode.gateway_router import GatewayRouter
from vnode.targets import same_hardware_targets


def _specgate_router(member: Member, tmp_path: Path, taught: tuple[int, int] | None) -> GatewayRouter:
    profile = member.profile()
    settings = WORKLOADS["poisson"].settings(profile, member.groups, Scale(), 0)
    _, targets = same_hardware_targets(BASE_PROFILE, member.write(tmp_path), Hardware(member.groups, profile.num_gpus),
                                       settings, QuietProgress())
    specgate = next(t for t in targets if t.gateway is not None)
    router = specgate.node(EventQueue(), taught=taught).router
    assert isinstance(router, GatewayRouter)
    return router


@pytest.mark.parametrize("name", ["x8-s2-line-k2", "x32-s1.5-line-k1"])
def test_a_taught_policy_knows_where_the_modes_cross_before_any_request(name: str, tmp_path: Path) -> None:
    member = Member.parse(name)
    untaught = _specgate_router(member, tmp_path, None).policy
    assert untaught.crossover() is None  # nothing fitted: it would learn from the traffic
    policy = _specgate_router(member, tmp_path, (128 + CHAT_TEMPLATE_TOKENS, 64)).policy
    crossover = policy.crossover()  # type: ignore[attr-defined]
    # A member's decode curves cross at `crossover - 0.5` (vnode/family.py), and the prefills beside each
    # request cost both kinds alike: the taught lines cross there too.
    assert crossover == pytest.approx(member.crossover - 0.5, abs=0.05)
    backends = policy.describe()["beliefs"]["backends"]  # type: ignore[attr-defined]
    assert len(backends) == 2 * member.groups and all(len(b["points"]) >= 4 for b in backends.values())


def test_the_family_command_runs_taught(tmp_path: Path) -> None:
    out = tmp_path / "taught.json"
    result = CliRunner().invoke(main, ["family", "--members", "x512-s3-line-k2", "--workloads", "poisson", "--jobs", "1",
                                       "--taught", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # EAGLE is faster at every load this member reaches: a policy that knows it from the start speculates
    # throughout, as eagle-dp does (untaught, a group turned plain on plain's prior and stayed there).
    assert "1 of 1 member x workload cells meet every bound" in result.output


def test_the_envelope_command_says_its_run_was_taught(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["envelope", "--profile", "field-8gpu", "--groups", "1", "--concurrency", "1,4", "--requests-per-level", "16",
            "--out", str(out)]
    assert CliRunner().invoke(main, [*args, "--taught"]).exit_code == 0
    document = orjson.loads((out / "results.json").read_bytes())
    assert document["stack"]["taught"] is True and "Taught:" in " ".join(document["preamble"])
