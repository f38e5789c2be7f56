"""Every argv the plan generates for the example configs is accepted by SGLang 0.5.23's own parser.

Runs `sglang.srt.server_args.prepare_server_args` in a separate venv (`.ci/sglang-env.sh DIR`
builds it; point SPECGATE_SGLANG_PYTHON at its python). The parser accepts abbreviations, so the
test also checks each flag against the parser's exact option strings.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from backends.plan import build_plan
from backends.sglang_args import DEPRECATED_FLAGS, PRIORITY_SCHEDULING_FLAG, REMOVED_FLAGS, flags_in
from gateway.config import load_settings

pytestmark = pytest.mark.sglang

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[1] / "deploy" / "configs"
LAUNCHER = ("-m", "sglang.launch_server")


def _plans() -> dict[str, tuple[str, ...]]:
    """`config:process` -> the server arguments (argv without `python -m sglang.launch_server`)."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(CONFIGS.glob("*.toml")):
        settings = load_settings(path)
        plan = build_plan(settings.planned_launch, eagle_cap=settings.resolved_policy.eagle_cap)
        for process in plan.processes:
            assert process.argv[1:3] == LAUNCHER
            out[f"{path.stem}:{process.name}"] = process.argv[3:]
    return out


PLANS = _plans()
NAMES = list(PLANS)


@pytest.fixture(scope="module")
def sglang_python() -> str:
    python = os.environ.get("SPECGATE_SGLANG_PYTHON")
    if not python:
        pytest.skip("SPECGATE_SGLANG_PYTHON is unset: build the parser venv with `.ci/sglang-env.sh DIR`")
    return python


@pytest.fixture(scope="module")
def parsed(sglang_python: str) -> dict[str, Any]:
    """One run of the checker over every example argv, plus deliberately wrong ones."""
    base = PLANS[NAMES[0]]
    probes = {
        **PLANS,
        "removed:--cuda-graph-max-bs": (*base, "--cuda-graph-max-bs", "8"),
        "abbreviated:--speculative-draft": (*base, "--speculative-draft", "/d"),
        "unknown:--no-such-flag": (*base, "--no-such-flag"),
    }
    names = list(probes)
    result = subprocess.run(
        [sglang_python, str(HERE / "sglang_argcheck.py")],
        input=json.dumps({"argvs": [list(probes[n]) for n in names]}),
        capture_output=True,
        text=True,
        cwd="/",  # keep the project's packages off the SGLang venv's import path
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    return {"options": set(out["option_strings"]), "results": dict(zip(names, out["results"], strict=True))}


def _role(name: str) -> str:
    """"config:g3-eagle" -> "eagle" (a process is named after its backend)."""
    return name.split(":")[1].rsplit("-", 1)[-1]


def _group(name: str) -> str | None:
    """"config:g3-eagle" -> "g3"; None outside topology "groups"."""
    process = name.split(":")[1]
    return process.split("-")[0] if "-" in process else None


def test_the_examples_cover_every_topology_and_all_processes() -> None:
    assert {_role(n) for n in NAMES} == {"eagle", "plain"}
    # Two each for the colocated and partitioned examples, 2K (K = 8) for the groups one.
    groups = [n for n in NAMES if n.startswith("h100x8-groups:")]
    assert len(NAMES) == 6 + 16
    assert groups == [f"h100x8-groups:g{i}-{role}" for i in range(8) for role in ("eagle", "plain")]


@pytest.mark.parametrize("name", NAMES)
def test_sglang_accepts_the_generated_argv(parsed: dict[str, Any], name: str) -> None:
    result = parsed["results"][name]
    assert result["ok"], f"SGLang rejected {name}: {result['error']}"
    values = result["values"]
    argv = PLANS[name]
    assert values["port"] == int(argv[argv.index("--port") + 1])
    assert values["enable_metrics"] is True
    assert values["enable_cache_report"] is True  # usage.prompt_tokens_details.cached_tokens on chat/completions
    assert values["tp_size"] == int(argv[argv.index("--tp-size") + 1])
    role, group = _role(name), _group(name)
    assert values["extra_metric_labels"] == ({"pool": role} if group is None else {"pool": role, "group": group})
    if role == "eagle":
        assert values["speculative_algorithm"] == "EAGLE3"
        assert values["max_running_requests"] == int(argv[argv.index("--max-running-requests") + 1])
        assert values["cuda_graph_max_bs_decode"] == values["max_running_requests"]
        assert (
            values["speculative_num_steps"],
            values["speculative_eagle_topk"],
            values["speculative_num_draft_tokens"],
        ) == (3, 1, 4)
    else:
        assert values["speculative_algorithm"] is None


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_is_an_exact_option_string(parsed: dict[str, Any], name: str) -> None:
    unknown = [f for f in flags_in(PLANS[name]) if f not in parsed["options"]]
    assert unknown == []


def test_removed_cuda_graph_flag_is_rejected(parsed: dict[str, Any]) -> None:
    result = parsed["results"]["removed:--cuda-graph-max-bs"]
    assert not result["ok"] and result["exit"] == 2
    assert "ambiguous option: --cuda-graph-max-bs" in result["error"][0]


def test_abbreviations_and_unknown_flags_are_caught(parsed: dict[str, Any]) -> None:
    assert not parsed["results"]["abbreviated:--speculative-draft"]["ok"]
    assert not parsed["results"]["unknown:--no-such-flag"]["ok"]
    # The exact-string check is what catches an abbreviation SGLang would still accept.
    assert "--mem-fraction" not in parsed["options"] and "--mem-fraction-static" in parsed["options"]


def test_the_removed_and_deprecated_flag_tables_match_sglang(parsed: dict[str, Any]) -> None:
    for flag in REMOVED_FLAGS:
        assert flag not in parsed["options"], f"{flag} is an option of SGLang again"
    for flag in DEPRECATED_FLAGS:
        assert flag in parsed["options"], f"{flag} is gone from SGLang: move it to REMOVED_FLAGS"


def test_priority_scheduling_is_an_exact_option_string(parsed: dict[str, Any]) -> None:
    # `tier_sglang_priority = true` appends it to both servers' argv (backends/sglang_args.py).
    assert PRIORITY_SCHEDULING_FLAG in parsed["options"]
