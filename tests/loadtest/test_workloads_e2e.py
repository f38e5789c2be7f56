"""Workloads end to end against the simulator: conversations re-send the answers it really gave,
shared prefixes and trace windows go through `sweep`, and the envelope runs open-loop levels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from backends.testbed import running_sim
from loadtest.cli import main
from loadtest.client import TargetClient, TargetOptions, open_session, served_model
from loadtest.load import run_plan
from loadtest.records import RequestRecord, RequestSpec
from loadtest.workloads.level import Level, RequestsPerLevel
from loadtest.workloads.multi_turn import MultiTurn
from loadtest.workloads.text import render
from loadtest.workloads.workload import Workload
from tokencount import count_tokens

CHAT_TOKENS_PER_MESSAGE, CHAT_REPLY_PRIMER_TOKENS = 4, 3  # the simulator's chat template (backends/sim/tokenizer.py)


async def test_every_turn_re_sends_the_answers_the_server_returned() -> None:
    workload = Workload(dataset=MultiTurn(turns=3, think_time_s=0.02, tenants=2, system_prompt_len=40), input_len=12,
                        output_len=6, requests_per_level=RequestsPerLevel(12), seed=3)
    plan = workload.plan(Level(request_rate=40.0), 0)
    sent: list[tuple[RequestSpec, RequestRecord]] = []
    with running_sim("--role", "plain", "--time-scale", "0.2") as sim:
        async with open_session(16, 30) as session:
            client = TargetClient(session, sim.url(), await served_model(session, sim.url(), None), TargetOptions())

            async def send(spec: RequestSpec) -> RequestRecord:
                record = await client.send(spec)
                sent.append((spec, record))
                return record

            run = await run_plan(send, plan)
    assert len(run.records) == plan.requests == 12 and all(r.ok for r in run.records)
    for conversation in plan.sessions:
        first = render(conversation.turns[0].user)
        turns = sorted(((s, r) for s, r in sent if (s.history[0].user if s.history else s.prompt) == first),
                       key=lambda sr: len(sr[0].history))
        assert [s.prompt for s, _ in turns] == [render(t.user) for t in conversation.turns]  # every turn, in order
        assert turns[0][1].start - run.started >= conversation.start_s  # never before its arrival time
        for k, (spec, record) in enumerate(turns):
            # Turn k carries the k answers the server gave to the turns before it, as it gave them.
            assert [h.answer for h in spec.history] == [r.answer for _, r in turns[:k]]
            assert spec.system == render(conversation.system) and count_tokens(record.answer) == 6
            # And the server counted all of it: the system prompt, each earlier question and answer, the new question.
            assert record.prompt_tokens == CHAT_REPLY_PRIMER_TOKENS + sum(
                CHAT_TOKENS_PER_MESSAGE + count_tokens(m["content"]) for m in spec.chat_messages())


def sweep(out: Path, url: str, *args: str) -> dict:
    result = CliRunner().invoke(main, ["sweep", "--target", f"sim={url}", "--warmup", "1", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text())


def test_shared_prefix_multi_turn_and_trace_sweeps(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in (
        {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]},
        {"timestamp": 100, "input_length": 700, "output_length": 5, "hash_ids": [0, 2]},
        {"timestamp": 300, "input_length": 200, "output_length": 6, "hash_ids": [0]},
    )))
    with running_sim("--role", "plain", "--time-scale", "0.2") as sim:
        gsp = sweep(tmp_path / "gsp", sim.url(), "--dataset", "shared-prefix", "--gsp-num-groups", "2",
                    "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "64", "--gsp-question-len", "8",
                    "--gsp-output-len", "4", "--request-rate", "50", "--burstiness", "0.5",
                    "--tier-mix", "priority=0.5,flex=0.5", "--slo-ttft-ms", "10000")
        chat = sweep(tmp_path / "chat", sim.url(), "--dataset", "multi-turn", "--turns", "2", "--think-time", "0.01",
                     "--concurrency", "2", "--requests-per-level", "4", "--min-requests-per-level", "0", "--input-len", "8",
                     "--output-len", "4",
                     "--length-dist", "lognormal")
        replay = sweep(tmp_path / "trace", sim.url(), "--dataset", "trace", "--trace", str(trace),
                       "--trace-time-scale", "1,0.5", "--endpoint", "completions")
    (level,) = gsp["levels"]
    t = level["targets"]["sim"]
    assert level["requests"] == t["completed"] == 6 and level["offered_request_s"] == 50.0
    assert set(t["tiers"]) == {"priority", "flex"} and t["goodput_request_s"] > 0 and t["cache_hit_rate"] == 0.0
    assert gsp["settings"]["dataset"]["gsp_num_groups"] == 2 and gsp["settings"]["burstiness"] == 0.5
    (level,) = chat["levels"]
    assert level["requests"] == level["targets"]["sim"]["completed"] == 4  # 2 conversations of 2 turns
    assert [lv["trace_time_scale"] for lv in replay["levels"]] == [1.0, 0.5]
    assert [lv["offered_request_s"] for lv in replay["levels"]] == [2 / 0.3, 2 / 0.15]
    for lv in replay["levels"]:
        t = lv["targets"]["sim"]
        assert t["completed"] == 3 and t["total_output_tokens"] == 15 and t["total_input_tokens"] == 1500  # exact lengths
    assert "| trace x0.5 | sim |" in (tmp_path / "trace" / "report.md").read_text()


@pytest.mark.slow
def test_the_envelope_runs_open_loop_levels_with_its_new_bounds(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "envelope", "--compare", "single", "--profile", "field-8gpu", "--policy", "threshold", "--request-rate", "10,20",
        "--requests-per-level", "6", "--dataset", "multi-turn", "--turns", "2", "--think-time", "0.05", "--tenants", "1",
        "--system-prompt-len", "32", "--output-len", "8", "--input-len", "8", "--warmup", "1",
        "--min-throughput-ratio", "0.01", "--max-tpot-ratio", "100", "--max-ttft-p50-ratio", "100",
        "--max-e2e-p50-ratio", "100", "--max-e2e-p99-ratio", "100", "--no-failed", "--out", str(tmp_path),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "results.json").read_text())
    scale = doc["stack"]["time_scale"]
    assert doc["mode"] == "open-loop" and scale == 0.5  # field-8gpu at these rates: the floor
    assert [lv["offered_request_s"] for lv in doc["levels"]] == [10 / scale, 20 / scale]  # the model's rate, on the wall clock
    for level in doc["levels"]:
        assert level["failed_requests"] == 0 and level["e2e_p99_ratio"] > 0
        assert all(t["completed"] == 6 for t in level["targets"].values())
    assert [c["name"] for c in doc["envelope"]["checks"]] == [
        "throughput_ratio", "tpot_ratio", "ttft_p50_ratio", "e2e_p50_ratio", "e2e_p99_ratio", "failed_requests"]
    assert doc["envelope"]["all_met"] and "failed_requests <= 0.0: met (worst 0 at" in result.output
    assert "| 10/s |" in (tmp_path / "report.md").read_text()
