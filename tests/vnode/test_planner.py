"""`specgate plan` for traffic: candidate layouts in virtual time, the ranked table, --json, --write-config, errors;
and `python -m loadtest envelope --plan` reading the layout back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from backends.plan import build_plan
from backends.sim.profiles import load_profile
from gateway.config import Settings, load_settings
from loadtest.cli import main as loadtest_main
from loadtest.envelope.fair import Hardware, specgate_config
from loadtest.envelope.harness import StackSettings
from loadtest.envelope.planned import PlannedLayout
from specgate.cli import main
from vnode.planner import candidates

LAYOUT_KEYS = {"topology", "groups", "gpus_per_group", "eagle_mem_fraction", "plain_mem_fraction", "plain_only_groups",
               "eagle_only_groups", "predicted"}
# Small but real: 2 GPUs of llama8b-h100 (6 candidates, 2 groupings' baselines), two levels of short requests.
SMALL = ("--profile", "llama8b-h100", "--gpus", "2", "--input-len", "64", "--output-len", "16", "--concurrency", "1,8",
         "--requests-per-level", "1x", "--min-requests-per-level", "4", "--warmup", "0", "--jobs", "1")


def plan_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["plan", *args])
    return result.exit_code, result.output


def planned(*args: str) -> dict[str, Any]:
    code, output = plan_cli(*SMALL, "--json", *args)
    assert code == 0, output
    return json.loads(output[output.index("{"):output.rindex("}") + 1])


def test_json_is_the_best_layout_with_exactly_the_contract_keys_and_its_predictions() -> None:
    layout = planned("--range-ratio", "0.5", "--dataset", "random")  # the load tool's workload options
    assert set(layout) == LAYOUT_KEYS
    # Short requests: today's layout, one co-located group per GPU at the launcher's default split.
    assert (layout["topology"], layout["groups"], layout["gpus_per_group"], layout["plain_only_groups"]) == ("groups", 2, 1, 0)
    assert (layout["eagle_mem_fraction"], layout["plain_mem_fraction"]) == (0.376, 0.424)
    assert [p["level"] for p in layout["predicted"]] == ["C=1", "C=8"]
    assert all(p["throughput_ratio"] >= 0.9 and p["output_tok_s"] > 0 for p in layout["predicted"])
    PlannedLayout.model_validate(layout)  # what `loadtest envelope --plan` reads


def test_the_table_ranks_every_candidate_and_write_config_is_a_serve_config_of_the_best(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    code, output = plan_cli(*SMALL, "--write-config", str(config))
    assert code == 0, output
    assert "Layouts, best first" in output and "predicted per level" in output
    assert "eagle 0.376: 30.1 GB" in output and "plain-only 0.88" in output  # each server's memory
    assert "8 candidate layouts (0 refused), 14 sweeps in" in output
    settings = load_settings(config)
    plan = build_plan(settings.launch, eagle_cap=settings.resolved_policy.eagle_cap)
    assert [(e.backend, e.group) for e in plan.endpoints] == [
        ("g0-eagle", "g0"), ("g0-plain", "g0"), ("g1-eagle", "g1"), ("g1-plain", "g1"),
    ]  # fmt: skip
    assert (settings.launch.eagle.mem_fraction_static, settings.launch.plain.mem_fraction_static) == (0.376, 0.424)


def test_every_split_keeps_a_server_for_the_longest_request_the_traffic_declares(tmp_path: Path) -> None:
    llama = load_profile("llama8b-h100")
    # Default: the model's context length (131,072 tokens), which an even split of one H100 holds in neither server.
    default = {c.name: c.hardware for c, _ in candidates(llama, 2, (0.5, 0.75))}
    assert (default["2x1 kv0.5"].eagle_mem_fraction, default["2x1 kv0.5"].plain_mem_fraction) == (0.376, 0.424)
    assert (default["2x1 kv0.75"].eagle_mem_fraction, default["2x1 kv0.75"].plain_mem_fraction) == (0.502, 0.297)  # EAGLE holds it
    short = {c.name: c.hardware for c, _ in candidates(llama, 2, (0.5,), longest_request_tokens=8192)}
    assert (short["2x1 kv0.5"].eagle_mem_fraction, short["2x1 kv0.5"].plain_mem_fraction) == (0.405, 0.394)
    config = tmp_path / "node.toml"
    code, output = plan_cli(*SMALL, "--longest-request-tokens", "8192", "--write-config", str(config))
    assert code == 0, output
    launch = load_settings(config).launch
    assert launch.longest_request_tokens == 8192
    assert build_plan(launch, eagle_cap=2).warnings == ()


def test_a_layout_that_cannot_hold_the_model_is_refused_with_the_reason() -> None:
    field = load_profile("field-8gpu")
    refused = {c.name: why for c, why in candidates(field, 8, (0.5,))}
    assert refused["4x2 kv0.5"] == "two copies of the weights (238 + 236 GB) do not fit in 0.8 of 2 x 180 GB"
    assert refused["8x1 kv0.5"] is not None and refused["2x4 kv0.5"] is None and refused["1x8 kv0.5"] is None
    code, output = plan_cli("--profile", "field-8gpu", "--concurrency", "1", "--requests-per-level", "2",
                            "--input-len", "16", "--output-len", "8", "--warmup", "0", "--jobs", "1")
    assert code == 0, output
    assert output.count("refused: two copies of the weights") == 8  # 8 x 1 and 4 x 2, each split and mix
    assert "20 candidate layouts (10 refused)" in output  # and 8 x 1 one-mode: one GPU holds no copy
    code, output = plan_cli("--profile", "field-8gpu", "--gpus", "2", "--concurrency", "1")
    assert code == 2 and "no layout of 2 GPUs holds the model" in output and "do not fit in 0.8 of 1 x 180 GB" in output


def test_one_mode_layouts_are_candidates_and_need_no_second_copy_of_the_weights() -> None:
    llama = {c.name: (c, why) for c, why in candidates(load_profile("llama8b-h100"), 8, (0.5,))}
    assert {"8x1 +4 EAGLE-only +4 plain-only", "8x1 +6 EAGLE-only +2 plain-only", "4x2 +2 EAGLE-only +2 plain-only",
            "4x2 +3 EAGLE-only +1 plain-only", "2x4 +1 EAGLE-only +1 plain-only"} <= set(llama)
    mixed, why = llama["8x1 +6 EAGLE-only +2 plain-only"]
    assert why is None and mixed.hardware == Hardware(8, 1, plain_only_groups=2, eagle_only_groups=6)
    assert mixed.describe() == "8 x 1 GPU : 6 EAGLE-only, 2 plain-only"
    # field-8gpu's weights fit two GPUs once, not twice: the one-mode 4 x 2 layouts are left to the sweep.
    field = {c.name: why for c, why in candidates(load_profile("field-8gpu"), 8, (0.5,))}
    assert field["4x2 kv0.5"] is not None and field["4x2 +2 EAGLE-only +2 plain-only"] is None
    layout = PlannedLayout(topology="groups", groups=4, gpus_per_group=2, eagle_mem_fraction=None, plain_mem_fraction=None,
                           plain_only_groups=1, eagle_only_groups=3, predicted=[])
    assert layout.hardware() == Hardware(4, 2, None, None, 1, 3)
    launch = specgate_config(StackSettings("field-8gpu", None, "groups", "adaptive"), layout.hardware(), 8000)["launch"]
    assert (launch["eagle_only_groups"], launch["plain_only_groups"], launch["eagle"], launch["plain"]) == (3, 1, {}, {})
    (process,) = build_plan(Settings.model_validate({"launch": launch}).launch, eagle_cap=16, free_port=lambda: 0).processes
    assert process.argv.count("--eagle-only-port") == 3 and "--eagle-mem-fraction" not in process.argv


def test_a_trace_plans_per_time_scale(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 300, "output_length": 8,
                                         "hash_ids": [i % 2]}) + "\n" for i in range(6)))
    layout = json.loads((lambda o: o[o.index("{"):o.rindex("}") + 1])(plan_cli(
        "--profile", "llama8b-h100", "--gpus", "2", "--dataset", "trace", "--trace", str(trace),
        "--trace-time-scale", "2,0.5", "--warmup", "0", "--jobs", "1", "--json")[1]))
    assert [p["level"] for p in layout["predicted"]] == ["trace x2", "trace x0.5"]


def test_an_unreadable_trace_and_an_impossible_rate_are_usage_errors(tmp_path: Path) -> None:
    code, output = plan_cli("--profile", "llama8b-h100", "--dataset", "trace", "--trace", str(tmp_path / "none.jsonl"))
    assert code == 2 and "does not exist" in output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    code, output = plan_cli("--profile", "llama8b-h100", "--dataset", "trace", "--trace", str(bad))
    assert code == 2 and "not JSON" in output
    code, output = plan_cli(*SMALL[:8], "--request-rate", "100000")
    assert code == 2 and "beyond any layout's capacity" in output and "the nearest feasible rate is" in output


def test_config_and_traffic_are_two_uses_of_the_command(tmp_path: Path) -> None:
    code, output = plan_cli()
    assert code == 2 and "give --config FILE" in output
    config = tmp_path / "c.toml"
    config.write_text("")
    code, output = plan_cli("--config", str(config), "--input-len", "64")
    assert code == 2 and "--input-len plans a node for traffic" in output


def test_the_envelope_runs_the_planned_layout(tmp_path: Path) -> None:
    layout = PlannedLayout(topology="groups", groups=4, gpus_per_group=2, eagle_mem_fraction=0.45,
                           plain_mem_fraction=0.35, plain_only_groups=1, predicted=[])
    assert layout.hardware() == Hardware(4, 2, 0.45, 0.35, 1)
    stack = StackSettings("llama8b-h100", None, "groups", "adaptive")
    launch = specgate_config(stack, layout.hardware(), 8000)["launch"]
    assert (launch["plain_only_groups"], launch["eagle"], launch["plain"]) == (
        1, {"mem_fraction_static": 0.45}, {"mem_fraction_static": 0.35},
    )  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(layout.model_copy(update={"groups": 8}).model_dump_json())
    out = tmp_path / "out"
    base = ["envelope", "--profile", "llama8b-h100", "--out", str(out), "--plan", str(path)]
    result = CliRunner().invoke(loadtest_main, base)  # 8 groups of 2 read from the file: more than the node
    assert result.exit_code == 2 and "--groups 8 x --gpus-per-group 2 needs 16 GPUs" in result.output
    result = CliRunner().invoke(loadtest_main, [*base, "--groups", "2"])
    assert result.exit_code == 2 and "--plan sets the layout: drop --groups" in result.output
    path.write_text('{"groups": 2}')
    result = CliRunner().invoke(loadtest_main, base)
    assert result.exit_code == 2 and "is not a `specgate plan --json` layout" in result.output
    assert not out.exists()


def test_long_contexts_give_eagle_more_of_the_memory() -> None:
    """Two H100s at 7,680 / 512 tokens up to 16 requests a group: the default split's EAGLE server holds 13 of them."""
    code, output = plan_cli("--profile", "llama8b-h100", "--gpus", "2", "--input-len", "7680", "--output-len", "512",
                            "--concurrency", "1,4,16,32", "--requests-per-level", "1x", "--min-requests-per-level", "4",
                            "--jobs", "1", "--json")
    assert code == 0, output
    layout = json.loads(output[output.index("{"):output.rindex("}") + 1])
    assert (layout["groups"], layout["plain_only_groups"]) == (2, 0)
    assert (layout["eagle_mem_fraction"], layout["plain_mem_fraction"]) == (0.502, 0.297)  # default: 0.376 / 0.424
    assert min(p["throughput_ratio"] for p in layout["predicted"]) > 0.9
