"""docs/benchmarks/real-traffic.md from benchmarks/real_traffic.py's data: headline, verdicts, every cell's numbers."""

from __future__ import annotations

from typing import Any

HEADLINE = ("llama8b-h100 K=8", "multi-turn")
RATIO_NAMES = {"throughput_ratio": "tok/s", "ttft_p50_ratio": "TTFT p50", "e2e_p50_ratio": "E2E p50",
               "e2e_p99_ratio": "E2E p99", "failed_requests": "failed"}
SUBJECT = "specgate"


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _best(level: dict[str, Any], key: str) -> str:
    best = level.get("best") or {}
    return best.get(key) or "-"


def _headline(cell: dict[str, Any]) -> list[str]:
    lines = [
        "## Headline: multi-turn on llama8b-h100, 8 x 1 GPU",
        "",
        "specgate against the best baseline at each rate (plain-dp, eagle-dp, adaptive-dp, each behind the "
        "least-in-flight balancer and behind SMG cache_aware); multi-turn: 4 tenants' 1,024-token system prompts, "
        "4-turn conversations re-sending their history, 1 s mean think time.",
        "",
        "| load | req/s | specgate tok/s | best tok/s (who) | TTFT p50 ms: specgate / best (who) | "
        "E2E p50 ms: specgate / best (who) | goodput req/s: specgate / best | cache hit: specgate / best | bounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for load, level in zip(cell["loads"], cell["levels"], strict=True):
        t = level["targets"]
        me = t[SUBJECT]
        tp, ttft, e2e = _best(level, "throughput"), _best(level, "ttft"), _best(level, "e2e_p50")
        good = max((v["goodput_request_s"] or 0.0) for n, v in t.items() if n != SUBJECT)
        hit = max((v["cache_hit_rate"] or 0.0) for n, v in t.items() if n != SUBJECT)
        lines.append(
            f"| {load:.0%} | {_f(level['offered_request_s'], 2)} | {_f(me['output_tok_s'])} | "
            f"{_f(t[tp]['output_tok_s'])} ({tp}) | {_f(me['ttft_p50_ms'])} / {_f(t[ttft]['ttft_p50_ms'])} ({ttft}) | "
            f"{_f(me['e2e_p50_ms'])} / {_f(t[e2e]['e2e_p50_ms'])} ({e2e}) | {_f(me['goodput_request_s'], 2)} / "
            f"{_f(good, 2)} | {_f(me['cache_hit_rate'], 3)} / {_f(hit, 3)} | {_verdict(cell, level)} |"
        )
    return lines + [""]


def _verdict(cell: dict[str, Any], level: dict[str, Any]) -> str:
    """The bounds this level misses (ratio and bound), or `met`."""
    misses = []
    for check in cell["checks"]:
        value = level["ratios"].get(check["name"])
        if value is None:
            continue
        ok = value >= check["bound"] if check["op"] == ">=" else value <= check["bound"]
        if not ok:
            misses.append(f"{RATIO_NAMES.get(check['name'], check['name'])} {value:.3g} (bound {check['bound']:g})")
    return "met" if not misses else "NOT MET: " + "; ".join(misses)


def _summary(cells: list[dict[str, Any]]) -> list[str]:
    lines = ["## Verdicts", "", "Worst ratio of specgate to the best baseline over the cell's rates (the level it "
             "was worst at); bold: a bound not met.", "",
             "| profile | workload | capacity req/s | tok/s | TTFT p50 | E2E p50 | E2E p99 | failed | all bounds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        checks = {c["name"]: c for c in cell["checks"]}
        row = [cell["machine"], cell["workload"], _f(cell["capacity_request_s"], 2)]
        for name in ("throughput_ratio", "ttft_p50_ratio", "e2e_p50_ratio", "e2e_p99_ratio", FAILED_KEY):
            check = checks.get(name)
            if check is None:
                worst = [lv["ratios"].get(name) for lv in cell["levels"] if lv["ratios"].get(name) is not None]
                row.append(f"({max(worst):.3f})" if worst else "-")
                continue
            text = f"{check['worst']:.3g} at {check.get('worst_level') or '-'}" if check["worst"] is not None else "-"
            row.append(text if check["met"] else f"**{text}**")
        row.append("met" if cell["all_met"] else "**NOT MET**")
        lines.append("| " + " | ".join(row) + " |")
    return lines + ["", "A ratio in parentheses is not a bound for that workload (its worst value is shown).", ""]


FAILED_KEY = "failed_requests"
TARGET_COLUMNS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "e2e_p50_ms", "e2e_p99_ms",
                  "cache_hit_rate", "goodput_request_s", "failed")


def _cell(cell: dict[str, Any]) -> list[str]:
    slo = cell["slo"]
    lines = [f"### {cell['machine']}, {cell['workload']}", "",
             f"plain-dp capacity {cell['capacity_request_s']:.2f} req/s; goodput SLO: TTFT <= {slo['ttft_ms']:.1f} ms "
             f"and TPOT <= {slo['tpot_ms']:.2f} ms; {cell['seconds']:.0f} s to run.", "",
             "| level | target | tok/s | TTFT p50 | TTFT p99 | TPOT p50 | E2E p50 | E2E p99 | cache hit | goodput | "
             "failed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for load, level in zip(cell["loads"], cell["levels"], strict=True):
        for i, (name, t) in enumerate(level["targets"].items()):
            head = f"{load:.0%} ({level['label']})" if i == 0 else ""
            lines.append(
                f"| {head} | {name} | {_f(t['output_tok_s'])} | {_f(t['ttft_p50_ms'])} | {_f(t['ttft_p99_ms'])} | "
                f"{_f(t['tpot_p50_ms'], 2)} | {_f(t['e2e_p50_ms'])} | {_f(t['e2e_p99_ms'])} | "
                f"{_f(t['cache_hit_rate'], 3)} | {_f(t['goodput_request_s'], 2)} | {t['failed']} |"
            )
        ratios = ", ".join(f"{RATIO_NAMES[k]} {v:.3f}" if k != FAILED_KEY else f"failed {v}"
                           for k, v in level["ratios"].items() if k in RATIO_NAMES and v is not None)
        lines.append(f"| | *specgate / best* | {ratios}; {_verdict(cell, level)} | | | | | | | | |")
    return lines + [""]


def markdown(data: dict[str, Any]) -> str:
    """The whole document."""
    cells = data["cells"]
    headline = next((c for c in cells if (c["machine"], c["workload"]) == HEADLINE), None)
    lines = [
        "# Real traffic: specgate against DP behind least-in-flight and behind SMG cache_aware (vnode)",
        "",
        f"Command: `{data['command']}` ({data['seconds']:.0f} s on this 2-core machine). Raw data: "
        f"[{data['raw']}]({data['raw']}). Hand-written diagnosis of the cells that miss a bound, and the "
        "check of the SMG emulation against the real SMG: [real-traffic-notes.md](real-traffic-notes.md).",
        "",
        "Modelled in virtual time (`vnode`): the simulator's engine cores, no HTTP. Targets on the same K x G GPUs: "
        "`specgate` (K co-located EAGLE-3 + plain groups, adaptive policy), `plain-dp`, `eagle-dp`, `adaptive-dp` "
        "(K servers of one mode) behind the least-in-flight balancer and, for K > 1, behind an emulation of SMG "
        "1.13.0's cache_aware policy at its defaults (`vnode/smg_router.py`; `+smg`). Open loop at 10-90% of "
        "plain-dp's capacity on each workload (plain-dp alone, every request sent at once); each request's own "
        "acceptance draws. Workloads: `shared-prefix` (16 system prompts of 2,048 tokens x 16 questions of 128, "
        "256-token answers), `multi-turn` (64 conversations of 4 turns, 4 tenants' 1,024-token system prompts, 1 s "
        f"think time), `trace` (the first {data['trace_requests']} requests of the Mooncake conversation trace, "
        "/work/shared/traces/mooncake-conversation.jsonl, Apache-2.0, its clock scaled to each rate), `random` "
        "(unique 128-token prompts, 128-token answers). Goodput: requests/s within the cell's TTFT and TPOT SLOs "
        "(2x the lowest TTFT p50 and 1.5x the lowest TPOT p50 of any target in a light run at 10%); no workload "
        "mixes service tiers, so there is no per-tier goodput. Latencies in model ms.",
        "",
        "Bounds (issue 28 part 4): `shared-prefix`, `multi-turn`, `trace`: specgate's output tok/s >= 0.97x, TTFT "
        "p50 <= 1.10x and E2E p50 <= 1.05x the best baseline, SMG's included (latencies against the lowest among "
        "the baselines that carry the load), no failed request; `random`: tok/s >= 0.97x, E2E p50 <= 1.05x, E2E p99 "
        "<= 1.10x, no failed request.",
        "",
    ]
    if data.get("eagle_kv_share") is not None:
        lines += [f"specgate's co-located groups split at EAGLE {data['eagle_kv_share']:g} of the KV room the two "
                  "copies of the weights leave (`--eagle-kv-share`; the launcher's default is 0.5).", ""]
    if headline is not None:
        lines += _headline(headline)
    lines += _summary(cells)
    lines += ["## Every cell", ""]
    for cell in cells:
        lines += _cell(cell)
    return "\n".join(lines)
