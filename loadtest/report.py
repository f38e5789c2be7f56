"""The files a sweep leaves in its output directory: results.json, results.csv, the plots, report.md."""

from __future__ import annotations

import csv
import datetime as dt
import importlib.metadata
import platform
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import orjson

from loadtest.plots import plot_latency, plot_throughput
from loadtest.sweep import LevelResult, SweepSettings, Target

# Limits past which a level's numbers may reflect the machine rather than the server: the load
# generator's loop woke late (shifts every timestamp it takes), it used most of a core, the whole
# machine was saturated, or the simulator's steps ended late by a visible share of a step.
MAX_LOOP_LAG_P99_MS = 10.0
MAX_LOADGEN_CPU_PCT = 85.0
MAX_MACHINE_BUSY_PCT = 90.0
MAX_SIM_LATENESS_SHARE = 0.10


def versions() -> dict[str, str]:
    """Versions of what produced the numbers."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("specgate", "aiohttp", "numpy", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def command_line(ctx: click.Context) -> str:
    """The command that reproduces this run, every option spelled out (defaults included)."""
    words = ["python", "-m", "loadtest", ctx.info_name or ""]
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        value = ctx.params.get(param.name)
        if value is None or value == ():
            continue
        if param.is_flag and param.secondary_opts:
            words.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            if value:
                words.append(param.opts[0])
        else:
            for item in value if param.multiple else (value,):
                words += [param.opts[0], str(item)]
    return shlex.join(words)


def level_document(result: LevelResult) -> dict[str, Any]:
    """One level as JSON: its load, then each target's numbers and self-checks."""
    return {
        "concurrency": result.level.concurrency,
        "request_rate": result.level.request_rate,
        "requests": result.requests,
        "targets": {
            name: {**tl.stats.flat(), "monitor": tl.monitor} for name, tl in result.targets.items()
        },
    }


def build_document(
    kind: str,
    results: Sequence[LevelResult],
    targets: Sequence[Target],
    settings: SweepSettings,
    command: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole results.json: inputs, every number, and the load-generator health verdict."""
    doc: dict[str, Any] = {
        "kind": kind,
        "command": command,
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "mode": "closed-loop" if settings.levels[0].concurrency is not None else "open-loop",
        "settings": {
            "requests_per_level": str(settings.requests_per_level),
            "input_len": settings.input_len,
            "output_len": settings.output_len,
            "range_ratio": settings.range_ratio,
            "stream": settings.stream,
            "endpoint": settings.endpoint,
            "warmup": settings.warmup,
            "seed": settings.seed,
            "timeout": settings.timeout,
        },
        "targets": {t.name: t.url for t in targets},
        "levels": [level_document(r) for r in results],
    }
    if extra:
        doc.update(extra)
    doc["health"] = health(doc)
    return doc


def health(doc: dict[str, Any]) -> dict[str, Any]:
    """Worst self-check figures over the sweep, and which levels crossed a limit."""
    worst_lag = worst_cpu = worst_busy = 0.0
    worst_slip: float | None = None
    flagged: list[str] = []
    for level in doc["levels"]:
        where = f"C={level['concurrency']}" if level["concurrency"] is not None else f"rate={level['request_rate']}"
        for name, t in level["targets"].items():
            mon = t["monitor"]
            lag = mon["loop_lag"]["p99_ms"] or 0.0
            cpu = mon["cpu"].get("loadgen_cpu_pct", 0.0)
            busy = mon["cpu"].get("machine_busy_pct", 0.0)
            slips = sim_lateness(mon)
            if slips:
                worst_slip = max(worst_slip or 0.0, max(slips))
            worst_lag, worst_cpu, worst_busy = max(worst_lag, lag), max(worst_cpu, cpu), max(worst_busy, busy)
            reasons = []
            if lag > MAX_LOOP_LAG_P99_MS:
                reasons.append(f"loop lag p99 {lag:.1f} ms")
            if cpu > MAX_LOADGEN_CPU_PCT:
                reasons.append(f"load generator CPU {cpu:.0f}%")
            if busy > MAX_MACHINE_BUSY_PCT:
                reasons.append(f"machine {busy:.0f}% busy")
            step = t.get("mean_chunk_interval_ms")
            if slips and step and max(slips) > MAX_SIM_LATENESS_SHARE * step:
                reasons.append(f"simulator steps {max(slips):.2f} ms late on average (steps of {step:.2f} ms)")
            if reasons:
                flagged.append(f"{name} {where}: " + ", ".join(reasons))
    return {
        "limits": {
            "loop_lag_p99_ms": MAX_LOOP_LAG_P99_MS,
            "loadgen_cpu_pct": MAX_LOADGEN_CPU_PCT,
            "machine_busy_pct": MAX_MACHINE_BUSY_PCT,
            "sim_step_lateness_share_of_step": MAX_SIM_LATENESS_SHARE,
        },
        "worst_loop_lag_p99_ms": worst_lag,
        "worst_loadgen_cpu_pct": worst_cpu,
        "worst_machine_busy_pct": worst_busy,
        "worst_sim_step_lateness_ms": worst_slip,
        "flagged": flagged,
        "ok": not flagged,
    }


def sim_lateness(monitor: dict[str, Any]) -> list[float]:
    """Mean step lateness (ms) of each simulator that reported it during a level."""
    return [v["mean_step_lateness_ms"] for v in (monitor.get("sim_slip") or {}).values() if v]


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{k}:{v:.4g}" if isinstance(v, float) else f"{k}:{v}" for k, v in value.items())
    return "" if value is None else value


def csv_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per level and target: every scalar, dicts as `key:value;...`."""
    rows = []
    for level in doc["levels"]:
        for name, t in level["targets"].items():
            mon = t["monitor"]
            slips = sim_lateness(mon)
            row = {
                "concurrency": level["concurrency"],
                "request_rate": level["request_rate"],
                "requests": level["requests"],
                "target": name,
                **{k: v for k, v in t.items() if k != "monitor"},
                "loop_lag_p99_ms": mon["loop_lag"]["p99_ms"],
                "loadgen_cpu_pct": mon["cpu"].get("loadgen_cpu_pct"),
                "machine_busy_pct": mon["cpu"].get("machine_busy_pct"),
                "sim_step_lateness_ms": max(slips) if slips else None,
            }
            for key in ("throughput_ratio", "tpot_ratio"):
                if key in level:
                    row[key] = level[key]
            rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def write_csv(doc: dict[str, Any], path: Path) -> None:
    """results.csv."""
    rows = csv_rows(doc)
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    """report.md: the pictures, the table, and how the numbers were checked."""
    lines = [f"# {doc.get('title', 'Load test report')}", ""]
    lines += [f"Command: `{doc['command']}`", "", f"Run at {doc['timestamp']}; " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()), ""]
    s = doc["settings"]
    shape = (
        f"{doc['mode']}, {s['requests_per_level']} requests per level, input {s['input_len']} / output {s['output_len']} "
        f"tokens (range ratio {s['range_ratio']}), {s['endpoint']} endpoint, {'streamed' if s['stream'] else 'not streamed'}, "
        "`ignore_eos` so every response has exactly the requested length."
    )
    lines += [shape, ""]
    for text in doc.get("preamble", []):
        lines += [text, ""]
    lines += ["![output throughput](throughput.png)", "", "![TPOT and TTFT p50](latency.png)", ""]
    if "envelope" in doc:
        lines += envelope_markdown(doc)
    lines += ["## Every level", ""]
    lines += [
        "| level | target | ok | errors | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | E2E p50 | backend share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in doc["levels"]:
        label = f"C={level['concurrency']}" if level["concurrency"] is not None else f"{level['request_rate']:g}/s"
        for name, t in level["targets"].items():
            errors = ", ".join(f"{k} {v}" for k, v in t["errors"].items()) or "0"
            share = ", ".join(f"{k} {v:.0%}" for k, v in (t["backend_share"] or {}).items()) or "-"
            lines.append(
                f"| {label} | {name} | {t['completed']} | {errors} | {t['request_s']:.2f} | {t['output_tok_s']:.1f} | "
                f"{_ms(t['ttft_p50_ms'])} | {_ms(t['ttft_p99_ms'])} | {_ms(t['tpot_p50_ms'], 2)} | {_ms(t['tpot_p99_ms'], 2)} | "
                f"{_ms(t['itl_p50_ms'], 2)} | {_ms(t['itl_p99_ms'], 2)} | {_ms(t['e2e_p50_ms'], 0)} | {share} |"
            )
    lines += ["", "Latencies in ms. TPOT excludes the first token; ITL is per token (a chunk of k tokens counts k gaps of 1/k), as SGLang's bench_serving.", ""]
    lines += health_markdown(doc)
    return "\n".join(lines) + "\n"


def envelope_markdown(doc: dict[str, Any]) -> list[str]:
    """The envelope ratios per level, and whether the requested bounds held."""
    env = doc["envelope"]
    lines = ["## Envelope", ""]
    lines += [
        "Throughput ratio = specgate output tok/s / max(eagle, plain); TPOT ratio = specgate TPOT p50 / min(eagle, plain).",
        "",
        "| concurrency | better throughput | throughput ratio | better TPOT p50 | TPOT ratio | specgate share |",
        "|---|---|---|---|---|---|",
    ]
    for level in doc["levels"]:
        t = level["targets"]
        best_tp = max(("eagle", "plain"), key=lambda n: t[n]["output_tok_s"])
        tpots = {n: t[n]["tpot_p50_ms"] for n in ("eagle", "plain") if t[n]["tpot_p50_ms"] is not None}
        best_tpot = min(tpots, key=lambda n: tpots[n]) if tpots else "-"
        share = ", ".join(f"{k} {v:.0%}" for k, v in (t["specgate"]["backend_share"] or {}).items()) or "-"
        lines.append(
            f"| {level['concurrency']} | {best_tp} {t[best_tp]['output_tok_s']:.1f} | {_ms(level['throughput_ratio'], 3)} | "
            f"{best_tpot} {_ms(tpots.get(best_tpot), 2)} | {_ms(level['tpot_ratio'], 3)} | {share} |"
        )
    lines.append("")
    for check in env["checks"]:
        mark = "met" if check["met"] else "NOT met"
        lines.append(f"- {check['name']} {check['op']} {check['bound']}: {mark} (worst {check['worst']:.3f} at C={check['worst_at']})")
    if env["checks"]:
        lines.append("")
    return lines


def health_markdown(doc: dict[str, Any]) -> list[str]:
    """How the load generator was checked not to be the bottleneck, with the measured figures."""
    h = doc["health"]
    lim = h["limits"]
    slip = "not exported" if h["worst_sim_step_lateness_ms"] is None else f"{h['worst_sim_step_lateness_ms']:.2f} ms"
    method = (
        "Everything (load generator, gateway, simulators) shares this machine's cores, so each level records the load "
        "generator's event-loop lag (how late a 10 ms timer fires), the CPU used by each process group and the whole "
        "machine, and each simulator's schedule slip as the mean lateness of its steps against the modelled "
        "timeline (steps run on absolute deadlines, so lateness does not add up over a request). "
        f"Limits: loop lag p99 <= {lim['loop_lag_p99_ms']} ms, load generator <= {lim['loadgen_cpu_pct']}% "
        f"of a core, machine <= {lim['machine_busy_pct']}% busy, simulator steps late on average by "
        f"<= {lim['sim_step_lateness_share_of_step']:.0%} of a step (the mean gap between a stream's chunks)."
    )
    worst = (
        f"Worst over the run: loop lag p99 {h['worst_loop_lag_p99_ms']:.2f} ms, load generator CPU "
        f"{h['worst_loadgen_cpu_pct']:.0f}%, machine {h['worst_machine_busy_pct']:.0f}% busy, simulator mean step "
        f"lateness {slip}."
    )
    lines = ["## Was the load generator the bottleneck?", "", method, "", worst, ""]
    if h["flagged"]:
        lines += ["Levels over a limit (treat their latencies with care):", ""]
        lines += [f"- {f}" for f in h["flagged"]]
    else:
        lines.append("No level crossed a limit.")
    lines.append("")
    lines += ["| level | target | loop lag p99 ms | loadgen CPU % | gateway CPU % | sims CPU % | machine busy % | sim step lateness ms |", "|---|---|---|---|---|---|---|---|"]
    for level in doc["levels"]:
        label = f"C={level['concurrency']}" if level["concurrency"] is not None else f"{level['request_rate']:g}/s"
        for name, t in level["targets"].items():
            mon = t["monitor"]
            cpu = mon["cpu"]
            slips = sim_lateness(mon)
            lines.append(
                f"| {label} | {name} | {_ms(mon['loop_lag']['p99_ms'], 2)} | {_ms(cpu.get('loadgen_cpu_pct'), 0)} | "
                f"{_ms(cpu.get('gateway_cpu_pct'), 0)} | {_ms(cpu.get('sims_cpu_pct'), 0)} | {_ms(cpu.get('machine_busy_pct'), 0)} | "
                f"{_ms(max(slips) if slips else None, 2)} |"
            )
    lines.append("")
    return lines


def write_all(doc: dict[str, Any], out_dir: Path) -> None:
    """Write results.json, results.csv, throughput.png, latency.png and report.md into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    write_csv(doc, out_dir / "results.csv")
    plot_throughput(doc, out_dir / "throughput.png")
    plot_latency(doc, out_dir / "latency.png")
    (out_dir / "report.md").write_text(markdown(doc))
