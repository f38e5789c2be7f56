"""The launch plan: exact argv/env for the example configs, derived defaults, warnings, `specgate plan`."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from backends.config import LaunchConfig
from backends.plan import LaunchPlan, PlanError, build_plan, redact_argv, redact_env
from backends.resolve import eagle_running_limit
from backends.sim.cli import read_settings
from backends.sim.layout import plan_layout
from backends.sim.profiles import load_profile
from gateway.config import load_settings
from specgate.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "configs"
SGLANG = ("python3", "-m", "sglang.launch_server")
SPEC_70B = (
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/models/EAGLE3-LLaMA3.3-Instruct-70B",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip
MODEL_70B = ("--model-path", "/models/Llama-3.3-70B-Instruct", "--served-model-name", "llama-3.3-70b-instruct")


def ports(start: int = 41000) -> Callable[[], int]:
    """A deterministic stand-in for the free-port picker."""
    counter = itertools.count(start)
    return lambda: next(counter)


def example_plan(name: str) -> LaunchPlan:
    settings = load_settings(CONFIGS / name)
    return build_plan(settings.launch, eagle_cap=settings.resolved_policy.eagle_cap)


def launch(**values: object) -> LaunchConfig:
    base: dict[str, object] = {
        "engine": "sglang",
        "model_path": "/m",
        "draft_model_path": "/d",
        "eagle": {"gpus": [0, 1, 2, 3], "port": 30001},
        "plain": {"gpus": [4, 5, 6, 7], "port": 30002},
    }
    return LaunchConfig.model_validate({**base, **values})


def warnings_of(config: LaunchConfig, eagle_cap: int = 2) -> tuple[str, ...]:
    return build_plan(config, eagle_cap=eagle_cap, free_port=ports()).warnings


# --- the example configs ---------------------------------------------------------------------


def test_example_configs_are_the_four_promised() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.toml")) == [
        "b200x8-colocated.toml",
        "b200x8-partitioned.toml",
        "h100-dev-colocated.toml",
        "h100x8-groups.toml",
    ]


def test_partitioned_8gpu_example_exact_argv_and_env() -> None:
    plan = example_plan("b200x8-partitioned.toml")
    eagle, plain = plan.processes
    assert plan.warnings == ()
    assert plan.sequential is False
    assert eagle.name == "eagle" and eagle.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    # spill policy, eagle_max_inflight 16 -> 16 + 4 slack
    assert eagle.argv == (
        *SGLANG, *MODEL_70B,
        "--host", "127.0.0.1", "--port", "30001", "--tp-size", "4",
        "--max-running-requests", "20", "--cuda-graph-max-bs-decode", "20",
        *SPEC_70B,
        "--enable-metrics", "--extra-metric-labels", '{"pool":"eagle"}', "--enable-cache-report",
    )  # fmt: skip
    assert plain.name == "plain" and plain.env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert plain.argv == (
        *SGLANG, *MODEL_70B,
        "--host", "127.0.0.1", "--port", "30002", "--tp-size", "4",
        "--enable-metrics", "--extra-metric-labels", '{"pool":"plain"}', "--enable-cache-report",
    )  # fmt: skip
    assert [(e.backend, e.url, e.speculative, e.served_model_name) for e in plan.endpoints] == [
        ("eagle", "http://127.0.0.1:30001", True, "llama-3.3-70b-instruct"),
        ("plain", "http://127.0.0.1:30002", False, "llama-3.3-70b-instruct"),
    ]


def test_colocated_8gpu_example_splits_memory_and_starts_in_turn() -> None:
    plan = example_plan("b200x8-colocated.toml")
    eagle, plain = plan.processes
    assert plan.warnings == ()
    assert plan.sequential is True
    all_gpus = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert eagle.env == all_gpus and plain.env == all_gpus
    assert eagle.argv == (
        *SGLANG, *MODEL_70B,
        "--host", "127.0.0.1", "--port", "30001", "--tp-size", "8", "--mem-fraction-static", "0.3",
        "--max-running-requests", "4", "--cuda-graph-max-bs-decode", "4",
        *SPEC_70B,
        "--enable-metrics", "--extra-metric-labels", '{"pool":"eagle"}', "--enable-cache-report",
    )  # fmt: skip
    # 0.55 of the GPU is 0.55 / (1 - 0.3) of what the plain server finds free after EAGLE loaded.
    assert plain.argv == (
        *SGLANG, *MODEL_70B,
        "--host", "127.0.0.1", "--port", "30002", "--tp-size", "8", "--mem-fraction-static", "0.785",
        "--enable-metrics", "--extra-metric-labels", '{"pool":"plain"}', "--enable-cache-report",
    )  # fmt: skip


def test_single_h100_example() -> None:
    plan = example_plan("h100-dev-colocated.toml")
    eagle, plain = plan.processes
    assert plan.warnings == ()
    assert plan.sequential is True
    assert eagle.env == plain.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert "--tp-size" in eagle.argv and eagle.argv[eagle.argv.index("--tp-size") + 1] == "1"
    assert _flag(eagle.argv, "--max-running-requests") == "20"  # threshold 16 + 4
    assert _flag(eagle.argv, "--mem-fraction-static") == "0.3"
    assert _flag(plain.argv, "--mem-fraction-static") == "0.642"  # 0.45 / 0.7, rounded down
    assert _flag(eagle.argv, "--model-path") == "/models/Llama-3.1-8B-Instruct"
    assert _flag(eagle.argv, "--speculative-draft-model-path") == "/models/EAGLE3-LLaMA3.1-Instruct-8B"


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- derived defaults -------------------------------------------------------------------------


@pytest.mark.parametrize(("cap", "limit"), [(0, 2), (1, 3), (2, 4), (8, 10), (16, 20), (48, 60)])
def test_eagle_running_limit_adds_a_quarter_at_least_two(cap: int, limit: int) -> None:
    assert eagle_running_limit(cap) == limit


def test_eagle_limits_follow_the_cap_and_explicit_values_win() -> None:
    derived = build_plan(launch(), eagle_cap=48).processes[0].argv
    assert _flag(derived, "--max-running-requests") == "60"
    assert _flag(derived, "--cuda-graph-max-bs-decode") == "60"
    explicit = launch(
        eagle={"gpus": [0, 1, 2, 3], "port": 30001, "max_running_requests": 32, "cuda_graph_max_bs_decode": 40}
    )
    argv = build_plan(explicit, eagle_cap=8).processes[0].argv
    assert _flag(argv, "--max-running-requests") == "32"
    assert _flag(argv, "--cuda-graph-max-bs-decode") == "40"
    only_limit = launch(eagle={"gpus": [0], "port": 30001, "max_running_requests": 12})
    assert _flag(build_plan(only_limit, eagle_cap=8).processes[0].argv, "--cuda-graph-max-bs-decode") == "12"


def test_plain_server_keeps_sglang_defaults_unless_set() -> None:
    plain = build_plan(launch(), eagle_cap=2).processes[1].argv
    for flag in (
        "--max-running-requests",
        "--cuda-graph-max-bs-decode",
        "--mem-fraction-static",
        "--speculative-algorithm",
    ):
        assert flag not in plain
    configured = launch(
        plain={"gpus": [4, 5, 6, 7], "port": 30002, "max_running_requests": 256, "mem_fraction_static": 0.8}
    )
    argv = build_plan(configured, eagle_cap=2).processes[1].argv
    assert _flag(argv, "--max-running-requests") == "256"
    assert _flag(argv, "--mem-fraction-static") == "0.8"


def test_tp_size_comes_from_the_gpus_unless_given() -> None:
    config = launch(
        eagle={"gpus": [0, 1], "port": 30001},
        plain={"gpus": [2, 3, 4, 5], "tp_size": 2, "port": 30002, "extra_args": ["--dp-size", "2"]},
    )
    plan = build_plan(config, eagle_cap=2)
    assert _flag(plan.processes[0].argv, "--tp-size") == "2"
    assert _flag(plan.processes[1].argv, "--tp-size") == "2"
    assert plan.warnings == ()


def test_colocated_default_shares_and_shared_gpu_list() -> None:
    config = launch(topology="colocated", eagle={"gpus": [0, 1], "port": 30001}, plain={"port": 30002})
    plan = build_plan(config, eagle_cap=2)
    eagle, plain = plan.processes
    assert _flag(eagle.argv, "--mem-fraction-static") == "0.3"
    assert _flag(plain.argv, "--mem-fraction-static") == "0.714"  # 0.5 / 0.7
    assert plain.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert _flag(plain.argv, "--tp-size") == "2"


def test_unset_ports_are_picked_and_every_endpoint_uses_its_own() -> None:
    config = launch(eagle={"gpus": [0]}, plain={"gpus": [1]})
    plan = build_plan(config, eagle_cap=2, free_port=ports(50000))
    assert [e.url for e in plan.endpoints] == ["http://127.0.0.1:50000", "http://127.0.0.1:50001"]
    assert _flag(plan.processes[0].argv, "--port") == "50000"


@pytest.mark.parametrize(
    ("host", "url"),
    [("0.0.0.0", "http://127.0.0.1:30001"), ("::", "http://[::1]:30001"), ("::1", "http://[::1]:30001")],
)
def test_endpoint_url_reaches_wildcard_hosts_over_loopback(host: str, url: str) -> None:
    config = launch(eagle={"gpus": [0], "host": host, "port": 30001})
    assert build_plan(config, eagle_cap=2).endpoints[0].url == url


def test_api_key_goes_to_every_server_and_user_env_is_kept() -> None:
    config = launch(backend_api_key="s3cret", plain={"gpus": [4], "port": 30002, "env": {"NCCL_DEBUG": "WARN"}})
    eagle, plain = build_plan(config, eagle_cap=2).processes
    assert _flag(eagle.argv, "--api-key") == "s3cret" and _flag(plain.argv, "--api-key") == "s3cret"
    assert plain.env == {"NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "4"}


def test_extra_args_come_last() -> None:
    config = launch(eagle={"gpus": [0], "port": 30001, "extra_args": ["--context-length", "8192"]})
    assert build_plan(config, eagle_cap=2).processes[0].argv[-2:] == ("--context-length", "8192")


# --- the simulator ----------------------------------------------------------------------------


def test_sim_partitioned_is_two_processes_of_the_sim_module() -> None:
    config = LaunchConfig(time_scale=0.25, startup_delay=1.5, seed=7, served_model_name="sim-model")
    plan = build_plan(config, eagle_cap=2, free_port=ports(42000))
    eagle, plain = plan.processes
    assert eagle.argv == (
        sys.executable, "-m", "backends.sim", "--role", "eagle", "--host", "127.0.0.1", "--port", "42000",
        "--profile", "field-8gpu", "--time-scale", "0.25", "--seed", "7", "--startup-delay", "1.5",
        "--served-model-name", "sim-model", "--enable-metrics", "--enable-cache-report", "--max-running-requests", "48",
        "--extra-metric-labels", '{"pool":"eagle"}',
    )  # fmt: skip
    assert plain.argv[3:9] == ("--role", "plain", "--host", "127.0.0.1", "--port", "42001")
    # The simulator's profile is its capacity model: the profile's EAGLE cap (48 is above the
    # policy's 2), plain untouched, no GPUs.
    assert "--max-running-requests" not in plain.argv and eagle.env == {}
    assert plan.sequential is False and plan.warnings == ()


def test_sim_eagle_runs_at_least_what_the_policy_sends_it() -> None:
    """A capped simulated EAGLE server would queue the adaptive policy's 128 and hide that wait."""
    eagle, plain = build_plan(LaunchConfig(), eagle_cap=128, free_port=ports()).processes
    assert _flag(eagle.argv, "--max-running-requests") == "128"
    assert "--max-running-requests" not in plain.argv
    (colocated,) = build_plan(LaunchConfig(topology="colocated"), eagle_cap=128, free_port=ports()).processes
    assert _flag(colocated.argv, "--eagle-max-running-requests") == "128"
    assert "--plain-max-running-requests" not in colocated.argv and "--max-running-requests" not in colocated.argv


def test_sim_profile_errors_are_plan_errors(tmp_path: Path) -> None:
    broken = tmp_path / "p.toml"
    broken.write_text("[eagle]\ntau = 0.5\n")
    with pytest.raises(PlanError, match="tau"):
        build_plan(LaunchConfig(profile_file=broken), eagle_cap=1, free_port=ports())
    with pytest.raises(PlanError, match="cannot read profile file /nonexistent/profile.toml"):
        build_plan(LaunchConfig(profile_file=Path("/nonexistent/profile.toml")), eagle_cap=1, free_port=ports())


def test_sim_colocated_is_one_process_with_two_endpoints(tmp_path: Path) -> None:
    profile_file = tmp_path / "p.toml"
    profile_file.write_text("[eagle]\nmax_running_requests = 20\n")
    config = LaunchConfig(topology="colocated", profile="llama8b-h100", profile_file=profile_file)
    plan = build_plan(config, eagle_cap=2, free_port=ports(43000))
    (process,) = plan.processes
    assert process.name == "colocated"
    assert process.argv[3:10] == (
        "--colocated",
        "--host",
        "127.0.0.1",
        "--eagle-port",
        "43000",
        "--plain-port",
        "43001",
    )
    assert _flag(process.argv, "--profile-file") == str(profile_file)
    assert _flag(process.argv, "--eagle-max-running-requests") == "20"  # the file's cap, above the policy's 2
    assert [(e.backend, e.url, e.speculative) for e in process.endpoints] == [
        ("eagle", "http://127.0.0.1:43000", True),
        ("plain", "http://127.0.0.1:43001", False),
    ]


def test_sim_gets_explicit_limits_and_the_api_key() -> None:
    config = LaunchConfig.model_validate({"backend_api_key": "k", "eagle": {"max_running_requests": 8}})
    eagle, plain = build_plan(config, eagle_cap=2, free_port=ports()).processes
    assert _flag(eagle.argv, "--max-running-requests") == "8"
    assert _flag(plain.argv, "--api-key") == "k"


# --- warnings ---------------------------------------------------------------------------------


def _one(warnings: tuple[str, ...], *needles: str) -> str:
    hits = [w for w in warnings if all(n in w for n in needles)]
    assert len(hits) == 1, f"expected one warning with {needles}, got {warnings}"
    return hits[0]


def test_warns_about_overlapping_gpus_in_partitioned_mode() -> None:
    warnings = warnings_of(
        launch(eagle={"gpus": [0, 1, 2, 3], "port": 30001}, plain={"gpus": [3, 4, 5, 6], "port": 30002})
    )
    assert "[3]" in _one(warnings, "share GPUs")


def test_warns_when_a_partitioned_server_has_no_gpus() -> None:
    _one(warnings_of(launch(plain={"port": 30002})), "launch.plain.gpus is empty")


def test_warns_when_tp_size_does_not_divide_the_gpus() -> None:
    _one(
        warnings_of(launch(eagle={"gpus": [0, 1, 2], "tp_size": 2, "port": 30001})),
        "tp_size 2 does not divide its 3 GPUs",
    )


def test_warns_when_gpus_would_stay_idle_or_are_too_few() -> None:
    idle = warnings_of(launch(eagle={"gpus": [0, 1, 2, 3], "tp_size": 2, "port": 30001}))
    assert "--dp-size 2" in _one(idle, "uses 2 of its 4 GPUs")
    too_few = warnings_of(launch(eagle={"gpus": [0, 1], "tp_size": 2, "port": 30001, "extra_args": ["--dp-size=2"]}))
    _one(too_few, "needs 4 GPUs")


def test_warns_about_missing_model_and_draft() -> None:
    warnings = warnings_of(launch(model_path=None, draft_model_path=None))
    _one(warnings, "launch.model_path is not set")
    _one(warnings, "launch.draft_model_path is not set", "EAGLE3")
    assert not any("draft" in w for w in warnings_of(launch(draft_model_path=None, speculative_algorithm="NEXTN")))


def test_warns_when_colocated_shares_leave_no_headroom() -> None:
    config = launch(topology="colocated", eagle={"gpus": [0], "mem_fraction_static": 0.4, "port": 30001},
                    plain={"gpus": [0], "mem_fraction_static": 0.55, "port": 30002})  # fmt: skip
    _one(warnings_of(config), "add up to 0.95")


def test_colocated_shares_of_one_or_more_are_an_error() -> None:
    config = launch(topology="colocated", eagle={"gpus": [0], "mem_fraction_static": 0.5, "port": 30001},
                    plain={"gpus": [0], "mem_fraction_static": 0.5, "port": 30002})  # fmt: skip
    with pytest.raises(PlanError, match="must stay below 1"):
        build_plan(config, eagle_cap=2)


def test_warns_when_colocated_servers_get_different_gpus() -> None:
    config = launch(topology="colocated", eagle={"gpus": [0, 1], "port": 30001}, plain={"gpus": [2, 3], "port": 30002})
    _one(warnings_of(config), "should share the same GPUs")


def test_warns_when_sglang_would_override_num_draft_tokens() -> None:
    _one(warnings_of(launch(num_steps=5, num_draft_tokens=4)), "num_steps + 1 = 6")
    assert warnings_of(launch(num_steps=5, eagle_topk=4, num_draft_tokens=8)) == ()


def test_warns_when_eagle_limits_are_below_the_policy() -> None:
    config = launch(
        eagle={"gpus": [0, 1, 2, 3], "port": 30001, "max_running_requests": 4, "cuda_graph_max_bs_decode": 2}
    )
    warnings = warnings_of(config, eagle_cap=8)
    _one(warnings, "max_running_requests = 4 is below", "cap 8")
    _one(warnings, "cuda_graph_max_bs_decode = 2 is below")


def test_warns_about_removed_and_duplicated_flags_in_extra_args() -> None:
    config = launch(eagle={"gpus": [0, 1, 2, 3], "port": 30001, "extra_args": ["--cuda-graph-max-bs", "8", "--port=9"]})
    warnings = warnings_of(config)
    assert "--cuda-graph-max-bs-decode" in _one(warnings, "--cuda-graph-max-bs is removed")
    _one(warnings, "--port is also set by the plan")
    # A flag the plan leaves unset is not a duplicate.
    assert (
        warnings_of(launch(plain={"gpus": [4, 5, 6, 7], "port": 30002, "extra_args": ["--mem-fraction-static", "0.8"]}))
        == ()
    )


def test_warns_when_both_servers_use_one_address() -> None:
    _one(warnings_of(launch(plain={"gpus": [4], "port": 30001})), "both use http://127.0.0.1:30001")


def test_sim_warnings() -> None:
    hosts = LaunchConfig.model_validate(
        {"topology": "colocated", "eagle": {"host": "127.0.0.1"}, "plain": {"host": "127.0.0.2"}}
    )
    _one(warnings_of(hosts), "one process on one host")


def test_negative_eagle_cap_is_an_error() -> None:
    with pytest.raises(PlanError):
        build_plan(launch(), eagle_cap=-1)


# --- groups -----------------------------------------------------------------------------------


def groups_launch(**values: object) -> LaunchConfig:
    base: dict[str, object] = {
        "engine": "sglang",
        "topology": "groups",
        "model_path": "/m",
        "draft_model_path": "/d",
        "eagle": {"port": 30000},
        "plain": {"port": 30100},
    }
    return LaunchConfig.model_validate({**base, **values})


def test_groups_from_gpu_sets_name_place_and_order_every_server() -> None:
    plan = build_plan(groups_launch(groups=[[0, 1, 2, 3], [4, 5, 6, 7]]), eagle_cap=16)
    assert plan.warnings == ()
    assert [p.name for p in plan.processes] == ["g0-eagle", "g0-plain", "g1-eagle", "g1-plain"]
    assert [(e.backend, e.group, e.url, e.speculative) for e in plan.endpoints] == [
        ("g0-eagle", "g0", "http://127.0.0.1:30000", True),
        ("g0-plain", "g0", "http://127.0.0.1:30100", False),
        ("g1-eagle", "g1", "http://127.0.0.1:30001", True),
        ("g1-plain", "g1", "http://127.0.0.1:30101", False),
    ]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plan.processes] == ["0,1,2,3", "0,1,2,3", "4,5,6,7", "4,5,6,7"]
    assert {_flag(p.argv, "--tp-size") for p in plan.processes} == {"4"}
    # Groups start in parallel; inside a group the plain server waits for the EAGLE one.
    assert [p.start_after for p in plan.processes] == [None, "g0-eagle", None, "g1-eagle"]
    assert plan.sequential is True
    g1_eagle, g1_plain = plan.processes[2:]
    # The templates' memory split and the EAGLE limits from the policy cap, in every group.
    assert _flag(g1_eagle.argv, "--mem-fraction-static") == "0.3"
    assert _flag(g1_plain.argv, "--mem-fraction-static") == "0.714"  # 0.5 / (1 - 0.3)
    assert _flag(g1_eagle.argv, "--max-running-requests") == "20"
    assert "--speculative-algorithm" not in g1_plain.argv
    assert _flag(g1_eagle.argv, "--extra-metric-labels") == '{"pool":"eagle","group":"g1"}'


def test_group_size_cuts_the_gpu_list_into_consecutive_groups() -> None:
    plan = build_plan(groups_launch(gpus=[2, 3, 4, 5, 6, 7], group_size=2), eagle_cap=2)
    assert [(e.backend, e.group) for e in plan.endpoints][::2] == [
        ("g0-eagle", "g0"),
        ("g1-eagle", "g1"),
        ("g2-eagle", "g2"),
    ]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plan.processes][::2] == ["2,3", "4,5", "6,7"]
    one_each = build_plan(groups_launch(gpus=list(range(8)), group_size=1), eagle_cap=2)
    assert len(one_each.processes) == 16
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in one_each.processes] == [str(i // 2) for i in range(16)]
    assert {_flag(p.argv, "--tp-size") for p in one_each.processes} == {"1"}
    assert one_each.warnings == ()


def test_a_plan_can_only_wait_for_an_earlier_process() -> None:
    eagle, plain = build_plan(launch(topology="colocated"), eagle_cap=2).processes
    with pytest.raises(ValueError, match="process eagle starts after 'plain', not an earlier process"):
        LaunchPlan(processes=(replace(eagle, start_after="plain"), plain), warnings=())


def test_groups_without_ports_get_free_ones_in_start_order() -> None:
    config = groups_launch(groups=[[0], [1]], eagle={}, plain={})
    plan = build_plan(config, eagle_cap=2, free_port=ports(50000))
    assert [e.url.rsplit(":", 1)[1] for e in plan.endpoints] == ["50000", "50001", "50002", "50003"]


def test_colocated_is_the_one_group_case_and_partitioned_servers_are_groups_of_their_own() -> None:
    colocated = build_plan(launch(topology="colocated"), eagle_cap=2)
    assert [(e.backend, e.group) for e in colocated.endpoints] == [("eagle", "g0"), ("plain", "g0")]
    assert [p.start_after for p in colocated.processes] == [None, "eagle"]
    assert _flag(colocated.processes[0].argv, "--extra-metric-labels") == '{"pool":"eagle"}'
    partitioned = build_plan(launch(), eagle_cap=2)
    assert [(e.backend, e.group) for e in partitioned.endpoints] == [("eagle", "eagle"), ("plain", "plain")]
    assert [p.start_after for p in partitioned.processes] == [None, None] and partitioned.sequential is False


def test_groups_warn_once_per_template_and_about_colliding_derived_ports() -> None:
    config = groups_launch(
        groups=[[0], [1], [2]], eagle={"port": 30001, "max_running_requests": 1}, plain={"port": 30002}
    )
    warnings = warnings_of(config, eagle_cap=8)
    _one(warnings, "launch.eagle.max_running_requests = 1 is below")
    # g1-eagle is 30001 + 1, g0-plain is 30002: the bases are closer than the number of groups.
    assert "launch.plain (g0-plain) and launch.eagle (g1-eagle) both use" in _one(warnings, "127.0.0.1:30002")
    _one(warnings, "127.0.0.1:30003", "at least the number of groups apart")


def test_groups_tp_warning_names_the_group() -> None:
    config = groups_launch(groups=[[0, 1, 2], [3, 4, 5]], eagle={"port": 30000, "tp_size": 2})
    _one(warnings_of(config), "launch.eagle (g1-eagle): tp_size 2 does not divide its 3 GPUs [3, 4, 5]")


def test_a_derived_port_above_65535_is_an_error() -> None:
    with pytest.raises(PlanError, match="launch.plain.port = 65535 plus group index 1"):
        build_plan(groups_launch(groups=[[0], [1]], plain={"port": 65535}), eagle_cap=2)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"groups": [[0, 1, 2, 3], [3, 4, 5, 6]]}, r"groups\n.*GPU 3 is in group 0 and group 1"),
        ({"groups": [[0], []]}, r"groups\n.*group 1 has no GPUs"),
        ({"groups": []}, r"groups\n.*at least one group"),
        ({"groups": [[0, 0]]}, r"groups\n.*GPU ids repeat"),
        ({"gpus": [0, 1, 2, 3, 4, 5], "group_size": 4}, "launch.group_size = 4 does not divide the 6 GPUs"),
        ({"group_size": 2}, "launch.group_size needs launch.gpus"),
        ({}, "needs launch.groups, or launch.group_size"),
        ({"groups": [[0]], "gpus": [0], "group_size": 1}, "needs launch.groups, or launch.group_size"),
        ({"groups": [[0]], "gpus": [1]}, "launch.gpus goes with launch.group_size"),
        ({"groups": [[0]], "eagle": {"gpus": [0]}}, "launch.eagle.gpus: with topology"),
        ({"topology": "colocated", "groups": [[0]]}, 'launch.groups applies only with topology = "groups"'),
        ({"topology": "partitioned", "gpus": [0, 1]}, 'launch.gpus applies only with topology = "groups"'),
        ({"groups": [[0]], "gpu_memory_gb": 80}, "launch.target_weights_gb is needed too"),
        ({"groups": [[0]], "draft_weights_gb": 1}, "launch.gpu_memory_gb is needed too"),
        ({"engine": "sim", "groups": [[0]], "gpu_memory_gb": 80}, "the simulator takes them from its profile"),
        ({"engine": "sim", "groups": [[0]], "kv_bytes_per_token": 131072}, "the simulator takes them from its profile"),
        ({"groups": [[0]], "longest_request_tokens": 131072}, "longest_request_tokens and kv_bytes_per_token go together"),
        ({"groups": [[0]], "kv_bytes_per_token": 131072, "gpu_memory_gb": 80, "target_weights_gb": 16},
         "longest_request_tokens and kv_bytes_per_token go together"),
    ],
)
def test_bad_groups_are_rejected_with_the_key_named(values: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"engine": "sglang", "topology": "groups"}
    with pytest.raises(ValidationError, match=message):
        LaunchConfig.model_validate({**base, **values})


def test_memory_check_refuses_a_group_too_small_for_two_copies_and_says_what_fits() -> None:
    # Llama-3.3-70B in bf16 on H100s: EAGLE's 0.3 of 4 x 80 GB is 96 GB, below 141 + 3 GB.
    sizes = {"gpu_memory_gb": 80, "target_weights_gb": 141, "draft_weights_gb": 3}
    config = groups_launch(gpus=list(range(8)), group_size=4, **sizes)
    with pytest.raises(PlanError) as caught:
        build_plan(config, eagle_cap=2)
    message = str(caught.value)
    assert "group g0 (GPUs [0, 1, 2, 3]) cannot hold both servers: the eagle server's" in message
    assert "96.0 GB, not more than its weights 141 + 3 GB (target + draft)" in message
    # 144 GB / (0.3 x 80 GB) = 6 GPUs at least, so equal groups of 8: one group.
    assert "needs at least 7 GPUs" in message and "hold 1 group(s) of 8 (launch.group_size = 8)" in message
    assert build_plan(groups_launch(gpus=list(range(8)), group_size=8, **sizes), eagle_cap=2).warnings == ()


def test_memory_check_names_the_plain_server_and_an_impossible_node() -> None:
    sizes = {"gpu_memory_gb": 80, "target_weights_gb": 30}
    config = groups_launch(groups=[[0]], eagle={"port": 30000, "mem_fraction_static": 0.5},
                           plain={"port": 30100, "mem_fraction_static": 0.3}, **sizes)  # fmt: skip
    with pytest.raises(PlanError, match="the plain server.s .* 24.0 GB, not more than its weights 30 GB; even all 1"):
        build_plan(config, eagle_cap=2)


def test_memory_check_passes_what_fits_and_is_silent_without_sizes() -> None:
    eight_b = {"gpu_memory_gb": 80, "target_weights_gb": 16.1, "draft_weights_gb": 2}
    assert build_plan(groups_launch(gpus=list(range(8)), group_size=1, **eight_b), eagle_cap=2).warnings == ()
    # The same 70B layout without sizes cannot be checked, so it is planned as written.
    assert len(build_plan(groups_launch(gpus=list(range(8)), group_size=4), eagle_cap=2).processes) == 4
    # Colocated is checked the same way; partitioned servers hold one copy each and are not.
    big = {"gpu_memory_gb": 80, "target_weights_gb": 141}
    with pytest.raises(PlanError, match="group g0 \\(GPUs \\[0, 1, 2, 3\\]\\)"):
        build_plan(launch(topology="colocated", **big), eagle_cap=2)
    assert build_plan(launch(**big), eagle_cap=2).warnings == ()


def test_the_default_split_gives_the_plain_server_room_for_the_longest_request() -> None:
    # Llama-3.1-8B on one H100 (128 KiB of KV per token): an even split leaves each server 15 GB, 118k tokens.
    eight_b = {"gpu_memory_gb": 80, "target_weights_gb": 16.1, "draft_weights_gb": 0.9, "kv_bytes_per_token": 131072}
    even = build_plan(groups_launch(groups=[[0]], **{k: v for k, v in eight_b.items() if k != "kv_bytes_per_token"}),
                      eagle_cap=2)
    assert [_flag(p.argv, "--mem-fraction-static") for p in even.processes] == ["0.405", "0.662"]  # 0.394 of the GPU
    long = build_plan(groups_launch(groups=[[0]], longest_request_tokens=131072, **eight_b), eagle_cap=2)
    eagle, plain = (float(_flag(p.argv, "--mem-fraction-static")) for p in long.processes)
    # SGLang reads the plain server's flag as a share of what EAGLE left free; the flag is rounded down to 0.001.
    plain_share = plain * (1 - eagle)
    need = 131072 * 131072 / 1e9
    assert plain_share * 80 - 16.1 == pytest.approx(need, abs=0.1) and eagle * 80 - 17.0 < need
    assert long.warnings == ()
    # Shares set by hand that leave no server room for it: said, with the keys to change.
    (warning,) = build_plan(groups_launch(groups=[[0]], longest_request_tokens=131072, eagle={"mem_fraction_static": 0.4},
                                          plain={"mem_fraction_static": 0.4}, **eight_b), eagle_cap=2).warnings
    assert warning.startswith("no server holds a request of 131072 tokens (launch.longest_request_tokens)")
    assert "17.2 GB it needs" in warning and "launch.plain.mem_fraction_static" in warning


def test_sim_warns_when_no_server_holds_a_context_length_request() -> None:
    split = {"eagle": {"mem_fraction_static": 0.4}, "plain": {"mem_fraction_static": 0.4}}
    config = LaunchConfig(topology="colocated", profile="llama8b-h100", **split)
    assert any(w.startswith("no server holds a request of the context length") for w in build_plan(config, eagle_cap=2).warnings)
    # Traffic declared shorter, or a server alone on its GPUs: nothing to say.
    assert build_plan(LaunchConfig(topology="colocated", profile="llama8b-h100", longest_request_tokens=8192, **split),
                      eagle_cap=2).warnings == ()
    assert build_plan(LaunchConfig(topology="groups", groups=[[0], [1]], plain_only_groups=1, profile="llama8b-h100", **split),
                      eagle_cap=2).warnings == ()


def test_sim_serves_every_group_from_one_process() -> None:
    config = LaunchConfig(topology="groups", groups=[[0, 1, 2, 3], [4, 5, 6, 7]], time_scale=0.5, profile="llama8b-h100")
    plan = build_plan(config, eagle_cap=2, free_port=ports(44000))
    (process,) = plan.processes
    assert process.name == "groups" and process.start_after is None
    assert process.argv[:20] == (
        sys.executable, "-m", "backends.sim", "--colocated", "--host", "127.0.0.1",
        "--eagle-port", "44000", "--eagle-port", "44002", "--plain-port", "44001", "--plain-port", "44003",
        "--eagle-mem-fraction", "0.401", "--plain-mem-fraction", "0.398", "--gpus-per-group", "4",
    )  # fmt: skip
    assert _flag(process.argv, "--time-scale") == "0.5" and "--enable-metrics" in process.argv
    assert "--enable-cache-report" in process.argv  # every group's servers report cached tokens
    assert _flag(process.argv, "--eagle-max-running-requests") == "48"
    assert [(e.backend, e.group, e.url) for e in process.endpoints] == [
        ("g0-eagle", "g0", "http://127.0.0.1:44000"),
        ("g0-plain", "g0", "http://127.0.0.1:44001"),
        ("g1-eagle", "g1", "http://127.0.0.1:44002"),
        ("g1-plain", "g1", "http://127.0.0.1:44003"),
    ]


def test_sim_colocated_passes_the_memory_split_and_groups_must_be_equal() -> None:
    config = LaunchConfig.model_validate({"topology": "colocated", "eagle": {"mem_fraction_static": 0.25}})
    (process,) = build_plan(config, eagle_cap=2, free_port=ports()).processes
    assert _flag(process.argv, "--eagle-mem-fraction") == "0.25"
    assert _flag(process.argv, "--plain-mem-fraction") == "0.55"  # the rest of 0.8: the profile's sizes are known
    assert "--gpus-per-group" not in process.argv  # no GPUs listed: the profile's count
    with pytest.raises(PlanError, match="launch.groups: the simulator runs groups of one size, got sizes \\[1, 2\\]"):
        build_plan(
            LaunchConfig(topology="groups", groups=[[0], [1, 2]], profile="llama8b-h100"), eagle_cap=2, free_port=ports()
        )


def test_sim_memory_check_uses_the_profile(tmp_path: Path) -> None:
    """Needs the profile's memory fields (gpu_memory_gb, target_weights_gb, draft_weights_gb)."""
    profile = tmp_path / "p.toml"
    profile.write_text("gpu_memory_gb = 80.0\ntarget_weights_gb = 100.0\ndraft_weights_gb = 2.0\n")
    too_small = LaunchConfig(topology="groups", gpus=list(range(8)), group_size=2, profile_file=profile)
    with pytest.raises(PlanError, match="group g0 \\(GPUs \\[0, 1\\]\\) cannot hold both servers.*hold 1 group"):
        build_plan(too_small, eagle_cap=2, free_port=ports())
    fits = LaunchConfig(topology="groups", gpus=list(range(8)), group_size=8, profile_file=profile)
    assert len(build_plan(fits, eagle_cap=2, free_port=ports()).endpoints) == 2
    # A colocated group that lists no GPUs runs on the profile's (field-8gpu: 8).
    assert len(build_plan(LaunchConfig(topology="colocated", profile_file=profile), eagle_cap=2).endpoints) == 2
    with pytest.raises(PlanError, match="leave no KV room in 0.88 of 1 x 80 GB"):
        build_plan(LaunchConfig(topology="colocated", profile="llama8b-h100", profile_file=profile), eagle_cap=2)


def test_plan_strict_fails_on_a_groups_warning_and_prints_every_server(tmp_path: Path) -> None:
    config = tmp_path / "groups.toml"
    config.write_text(
        '[launch]\nengine = "sglang"\ntopology = "groups"\nmodel_path = "/m"\ndraft_model_path = "/d"\n'
        "gpus = [0, 1, 2, 3]\ngroup_size = 1\n[launch.eagle]\nport = 30000\n[launch.plain]\nport = 30002\n"
    )
    code, output = run_plan("--config", str(config), "--strict")
    assert code == 1
    assert "topology groups" in output and "8 process(es)" in output
    for group in range(4):
        assert f"CUDA_VISIBLE_DEVICES={group} python3 -m sglang.launch_server" in output
    assert "launch.plain (g0-plain) and launch.eagle (g2-eagle) both use http://127.0.0.1:30002" in output
    doc = json.loads(run_plan("--config", str(config), "--json")[1])
    assert [e["backend"] for p in doc["processes"] for e in p["endpoints"]][:3] == ["g0-eagle", "g0-plain", "g1-eagle"]
    assert run_plan("--config", str(CONFIGS / "h100x8-groups.toml"), "--strict")[0] == 0


# --- config validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"speculative_algorithm": "MEDUSA"}, "unknown speculative_algorithm"),
        ({"served_model_name": "llama:lora"}, "may not contain ':'"),
        ({"eagle": {"gpus": [0, 0]}}, "GPU ids repeat"),
        ({"eagle": {"gpus": [-1]}}, "GPU ids are >= 0"),
        ({"eagle": {"mem_fraction_static": 1.2}}, "less than 1"),
        ({"plain": {"port": 70000}}, "less than or equal to 65535"),
        ({"restart_backoff_initial": 10, "restart_backoff_max": 5}, "below restart_backoff_initial"),
        ({"eagle": {"gpu": [0]}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_launch_config_is_rejected_with_the_key_named(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LaunchConfig.model_validate(values)


def test_algorithm_is_normalised_to_sglang_spelling() -> None:
    assert LaunchConfig(speculative_algorithm="eagle3").speculative_algorithm == "EAGLE3"


# --- redaction --------------------------------------------------------------------------------


def test_redaction_hides_keys_in_both_flag_forms_and_secret_env() -> None:
    assert redact_argv(("x", "--api-key", "k1", "--admin-api-key=k2", "--port", "1")) == (
        "x", "--api-key", "***", "--admin-api-key=***", "--port", "1",
    )  # fmt: skip
    assert redact_env({"HF_TOKEN": "t", "CUDA_VISIBLE_DEVICES": "0"}) == {
        "HF_TOKEN": "***",
        "CUDA_VISIBLE_DEVICES": "0",
    }


# --- specgate plan ----------------------------------------------------------------------------


def plan_outputs(config: str) -> tuple[str, dict[str, Any]]:
    """`specgate plan`'s text and its --json document for `config`, both of a successful run."""
    code, output = run_plan("--config", config)
    assert code == 0, output
    code, raw = run_plan("--config", config, "--json")
    assert code == 0, raw
    return output, json.loads(raw)


def write_config(path: Path, text: str) -> str:
    """Write a config file for `specgate plan`; its path as an argument."""
    path.write_text(text)
    return str(path)


def run_plan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["plan", *args])
    return result.exit_code, result.output


def test_plan_json_is_the_plan() -> None:
    code, output = run_plan("--config", str(CONFIGS / "b200x8-partitioned.toml"), "--json")
    assert code == 0, output
    doc = json.loads(output)
    plan = example_plan("b200x8-partitioned.toml")
    assert doc["engine"] == "sglang" and doc["topology"] == "partitioned"
    assert doc["policy"] == "spill" and doc["eagle_cap"] == 16
    assert doc["sequential"] is False and doc["warnings"] == [] and doc["unset_ports"] == []
    assert [p["argv"] for p in doc["processes"]] == [list(p.argv) for p in plan.processes]
    assert [p["env"] for p in doc["processes"]] == [p.env for p in plan.processes]
    assert doc["processes"][0]["endpoints"] == [
        {
            "backend": "eagle",
            "url": "http://127.0.0.1:30001",
            "speculative": True,
            "served_model_name": "llama-3.3-70b-instruct",
            "group": "eagle",
        }
    ]
    assert [p["start_after"] for p in doc["processes"]] == [None, None]
    assert doc["processes"][1]["command"].startswith("CUDA_VISIBLE_DEVICES=4,5,6,7 python3 -m sglang.launch_server ")


def test_plan_text_is_pasteable_and_lists_warnings(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "node.toml",
        '[launch]\nengine = "sglang"\nmodel_path = "/m"\nbackend_api_key = "top-secret"\n'
        "[launch.eagle]\ngpus = [0, 1]\nport = 30001\n[launch.plain]\ngpus = [1, 2]\nport = 30002\n"
    )
    code, output = run_plan("--config", config)
    assert code == 0, output
    assert "top-secret" not in output and "--api-key '***'" in output
    assert "CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server \\\n" in output
    assert '--extra-metric-labels \'{"pool":"eagle"}\'' in output
    assert "2 warning(s):" in output and "share GPUs [1]" in output and "draft_model_path is not set" in output
    code, output = run_plan("--config", config, "--json")
    assert code == 0 and "top-secret" not in output
    assert run_plan("--config", config, "--strict")[0] == 1


def test_plan_of_groups_shows_each_group_and_its_start_order(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "groups.toml",
        '[launch]\nengine = "sglang"\nmodel_path = "/m"\ndraft_model_path = "/d"\ntopology = "groups"\n'
        "groups = [[0], [1]]\n"
    )
    output, doc = plan_outputs(config)
    assert "start order: in parallel, except that each co-located group starts its plain server once its EAGLE" in output
    assert "  starts once g0-eagle is ready" in output and "  starts once g1-eagle is ready" in output
    assert "(group g0, speculative" in output and "(group g1, plain" in output
    assert doc["sequential"] is True
    after = {p["name"]: p["start_after"] for p in doc["processes"]}
    groups = {e["backend"]: e["group"] for p in doc["processes"] for e in p["endpoints"]}
    assert groups == {"g0-eagle": "g0", "g0-plain": "g0", "g1-eagle": "g1", "g1-plain": "g1"}
    assert sum(v is not None for v in after.values()) == 2


def test_plan_names_unset_ports_and_external_backends(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "ext.toml",
        '[[backends]]\nname = "eagle"\nurl = "http://10.0.0.1:1"\nspeculative = true\n'
        '[[backends]]\nname = "plain"\nurl = "http://10.0.0.1:2"\nspeculative = false\n'
    )
    output, doc = plan_outputs(config)
    assert "starts nothing" in output
    assert "launch.eagle.port is unset" in output
    assert doc["launches_backends"] is False and doc["unset_ports"] == ["launch.eagle.port", "launch.plain.port"]


def test_plan_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    code, output = run_plan("--config", str(tmp_path / "missing.toml"))
    assert code == 1 and "config file not found" in output
    bad = tmp_path / "bad.toml"
    bad.write_text('[launch]\nengine = "vllm"\n')
    code, output = run_plan("--config", str(bad))
    assert code == 1 and "launch.engine" in output
    broken = tmp_path / "broken.toml"
    broken.write_text("[launch\n")
    code, output = run_plan("--config", str(broken))
    assert code == 1 and "Error:" in output
    impossible = tmp_path / "impossible.toml"
    impossible.write_text(
        '[launch]\nengine = "sglang"\ntopology = "colocated"\n'
        "[launch.eagle]\nmem_fraction_static = 0.6\n[launch.plain]\nmem_fraction_static = 0.6\n"
    )
    code, output = run_plan("--config", str(impossible))
    assert code == 1 and "must stay below 1" in output


# --- plain-only groups ------------------------------------------------------------------------


def test_plain_only_groups_run_a_plain_server_alone_at_its_own_default_memory() -> None:
    plan = build_plan(groups_launch(gpus=[0, 1, 2, 3], group_size=1, plain_only_groups=2), eagle_cap=16)
    assert [p.name for p in plan.processes] == ["g0-eagle", "g0-plain", "g1-eagle", "g1-plain", "g2-plain", "g3-plain"]
    assert [(e.backend, e.group, e.speculative) for e in plan.endpoints][4:] == [
        ("g2-plain", "g2", False), ("g3-plain", "g3", False),
    ]  # fmt: skip
    g1_plain, g2_plain = plan.processes[3:5]
    assert _flag(g1_plain.argv, "--mem-fraction-static") == "0.714"  # co-located: 0.5 / (1 - 0.3)
    assert "--mem-fraction-static" not in g2_plain.argv  # alone on its GPUs: SGLang's own default
    assert g2_plain.start_after is None and g2_plain.env["CUDA_VISIBLE_DEVICES"] == "2"
    assert plan.warnings == ()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"groups": [[0], [1]], "plain_only_groups": 2}, "plain_only_groups = 2 leaves no co-located group of the 2"),
        ({"topology": "colocated", "plain_only_groups": 1}, 'plain_only_groups applies only with topology = "groups"'),
    ],
)
def test_plain_only_groups_leave_a_co_located_group(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        groups_launch(**values)


# --- EAGLE-only groups ------------------------------------------------------------------------


def test_eagle_only_groups_run_an_eagle_server_alone_between_the_co_located_and_the_plain_only_ones() -> None:
    plan = build_plan(groups_launch(gpus=[0, 1, 2, 3], group_size=1, eagle_only_groups=2, plain_only_groups=1), eagle_cap=16)
    assert [p.name for p in plan.processes] == ["g0-eagle", "g0-plain", "g1-eagle", "g2-eagle", "g3-plain"]
    assert [(e.backend, e.group, e.speculative) for e in plan.endpoints][2:] == [
        ("g1-eagle", "g1", True), ("g2-eagle", "g2", True), ("g3-plain", "g3", False),
    ]  # fmt: skip
    g0_eagle, g1_eagle = plan.processes[0], plan.processes[2]
    assert _flag(g0_eagle.argv, "--mem-fraction-static") is not None  # co-located: its share of the split
    assert "--mem-fraction-static" not in g1_eagle.argv  # alone on its GPUs: SGLang's own default
    assert _flag(g1_eagle.argv, "--speculative-algorithm") == "EAGLE3"
    assert _flag(g1_eagle.argv, "--max-running-requests") == _flag(g0_eagle.argv, "--max-running-requests") == "20"
    assert g1_eagle.start_after is None and g1_eagle.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert plan.warnings == ()


def test_a_node_of_eagle_only_and_plain_only_groups_needs_no_memory_split() -> None:
    plan = build_plan(groups_launch(groups=[[0, 1], [2, 3]], eagle_only_groups=1, plain_only_groups=1), eagle_cap=16)
    assert [(p.name, p.env["CUDA_VISIBLE_DEVICES"]) for p in plan.processes] == [("g0-eagle", "0,1"), ("g1-plain", "2,3")]
    assert all("--mem-fraction-static" not in p.argv for p in plan.processes)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"groups": [[0], [1]], "eagle_only_groups": 2}, "eagle_only_groups = 2 leaves no group running plain of the 2"),
        ({"groups": [[0], [1], [2]], "eagle_only_groups": 2, "plain_only_groups": 2},
         "eagle_only_groups = 2 and plain_only_groups = 2 are more than the 3 groups"),
        ({"topology": "colocated", "eagle_only_groups": 1}, 'eagle_only_groups applies only with topology = "groups"'),
    ],
)
def test_eagle_only_groups_leave_a_plain_server(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        groups_launch(**values)


def test_sim_serves_eagle_only_groups_from_the_same_process_on_the_profiles_own_share() -> None:
    config = LaunchConfig(topology="groups", gpus=[0, 1, 2, 3], group_size=1, eagle_only_groups=2, plain_only_groups=1,
                          profile="llama8b-h100")
    (process,) = build_plan(config, eagle_cap=2, free_port=ports(44000)).processes
    assert process.argv.count("--eagle-only-port") == 2 and _flag(process.argv, "--plain-only-port") == "44004"
    assert [(e.backend, e.speculative) for e in process.endpoints] == [
        ("g0-eagle", True), ("g0-plain", False), ("g1-eagle", True), ("g2-eagle", True), ("g3-plain", False),
    ]  # fmt: skip
    slots = plan_layout(read_settings(process.argv[3:]), load_profile("llama8b-h100"))
    assert [(s.role, s.group, s.mem_share) for s in slots] == [
        ("eagle", 0, 0.376), ("plain", 0, 0.424), ("eagle", 1, 0.88), ("eagle", 2, 0.88), ("plain", 3, 0.88),
    ]  # fmt: skip
    assert slots[2].max_total_tokens == 385000  # alone on its GPU: the profile's own EAGLE server
    # No co-located group at all: still one process, no memory split given.
    config = config.model_copy(update={"eagle_only_groups": 3})
    (process,) = build_plan(config, eagle_cap=2, free_port=ports(45000)).processes
    assert "--eagle-mem-fraction" not in process.argv and "--eagle-port" not in process.argv
    assert [s.mem_share for s in plan_layout(read_settings(process.argv[3:]), load_profile("llama8b-h100"))] == [0.88] * 4


def test_sim_serves_plain_only_groups_from_the_same_process_on_the_profiles_own_share() -> None:
    config = LaunchConfig(topology="groups", gpus=[0, 1, 2], group_size=1, plain_only_groups=1, profile="llama8b-h100")
    (process,) = build_plan(config, eagle_cap=2, free_port=ports(44000)).processes
    assert _flag(process.argv, "--plain-only-port") == "44004"
    assert [(e.backend, e.group, e.speculative) for e in process.endpoints][-1] == ("g2-plain", "g2", False)
    slots = plan_layout(read_settings(process.argv[3:]), load_profile("llama8b-h100"))
    assert [(s.role, s.group, s.mem_share) for s in slots] == [
        ("eagle", 0, 0.376), ("plain", 0, 0.424), ("eagle", 1, 0.376), ("plain", 1, 0.424), ("plain", 2, 0.88),
    ]  # fmt: skip
    assert slots[-1].max_total_tokens == 400000  # alone on its GPU: the profile's own server
