"""The files a sweep leaves in its output directory: results.json, results.csv, the plots, report.md."""

from __future__ import annotations

import csv
import datetime as dt
import importlib.metadata
import platform
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from loadtest.health import assess
from loadtest.plots import plot_latency, plot_throughput
from loadtest.results import LevelResult, ResultsDocument
from loadtest.sweep import SweepSettings, Target


def versions() -> dict[str, str]:
    """Versions of what produced the numbers."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("specgate", "aiohttp", "numpy", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def command_line(ctx: click.Context, program: str = "python -m loadtest") -> str:
    """The command that reproduces this run (`program`, then the subcommand), every option spelled out (defaults
    included), then its arguments."""
    words = [*program.split(), ctx.info_name or ""]
    arguments: list[str] = []
    for param in ctx.command.params:
        if isinstance(param, click.Argument) and param.name is not None:
            value = ctx.params.get(param.name)
            arguments += [str(v) for v in value] if isinstance(value, (tuple, list)) else [] if value is None else [str(value)]
            continue
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
    return shlex.join(words + arguments)


def build_document(
    kind: str,
    results: Sequence[LevelResult],
    targets: Sequence[Target],
    settings: SweepSettings,
    command: str,
    *,
    title: str | None = None,
    stack: dict[str, Any] | None = None,
    preamble: Sequence[str] | None = None,
) -> ResultsDocument:
    """The whole results document: inputs, every number, and the load-generator health verdict."""
    return ResultsDocument(
        kind=kind,
        command=command,
        timestamp=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        versions=versions(),
        mode="closed-loop" if settings.levels[0].concurrency is not None else "open-loop",
        settings={
            "requests_per_level": str(settings.requests_per_level),
            "input_len": settings.input_len,
            "output_len": settings.output_len,
            "range_ratio": settings.range_ratio,
            "stream": settings.stream,
            "endpoint": settings.endpoint,
            "warmup": settings.warmup,
            "seed": settings.seed,
            "timeout": settings.timeout,
            **settings.workload.settings(),
            "slo_ttft_ms": settings.slo.ttft_ms,
            "slo_tpot_ms": settings.slo.tpot_ms,
        },
        targets={t.name: t.url for t in targets},
        levels=tuple(results),
        health=assess(results),
        title=title,
        stack=stack,
        preamble=tuple(preamble) if preamble is not None else None,
    )


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{k}:{v:.4g}" if isinstance(v, float) else f"{k}:{v}" for k, v in value.items())
    return "" if value is None else value


def csv_rows(doc: ResultsDocument) -> list[dict[str, Any]]:
    """One row per level and target: every scalar, dicts as `key:value;...`, then the level's ratios."""
    rows = []
    for level in doc.levels:
        for name, t in level.targets.items():
            mon = t.monitor
            slips = mon.sim_lateness_ms()
            scalars = t.scalars()
            tiers = scalars.pop("tiers", None) or {}
            row = {
                "concurrency": level.concurrency,
                "request_rate": level.request_rate,
                **{k: v for k, v in (("offered_request_s", level.offered_request_s),
                                     ("trace_time_scale", level.trace_time_scale),
                                     ("rate_step", level.rate_step)) if v is not None},
                "requests": level.requests,
                "target": name,
                **scalars,
                **{f"tier_{tier}_{key}": value for tier, numbers in tiers.items() for key, value in numbers.items()},
                "loop_lag_p99_ms": mon.loop_lag_p99_ms,
                "loadgen_cpu_pct": mon.cpu.get("loadgen_cpu_pct"),
                "machine_busy_pct": mon.cpu.get("machine_busy_pct"),
                "sim_step_lateness_ms": max(slips) if slips else None,
                **level.ratios,
            }
            rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def write_csv(doc: ResultsDocument, path: Path) -> None:
    """results.csv."""
    rows = csv_rows(doc)
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def fixed(value: float | None, digits: int = 1) -> str:
    """`value` with `digits` decimals, or `-` when not measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(doc: ResultsDocument, sections: Sequence[str] = ()) -> str:
    """report.md: the pictures, `sections` (lines a harness adds, e.g. the envelope), the table, the checks."""
    lines = [f"# {doc.title or 'Load test report'}", ""]
    lines += [f"Command: `{doc.command}`", "", f"Run at {doc.timestamp}; " + ", ".join(f"{k} {v}" for k, v in doc.versions.items()), ""]
    s = doc.settings
    shape = workload_text(doc) if "dataset" in s else (
        f"{doc.mode}, {s['requests_per_level']} requests per level, input {s['input_len']} / output {s['output_len']} "
        f"tokens (range ratio {s['range_ratio']}), {s['endpoint']} endpoint, {'streamed' if s['stream'] else 'not streamed'}, "
        "`ignore_eos` so every response has exactly the requested length."
    )
    lines += [shape, ""]
    for text in doc.preamble or ():
        lines += [text, ""]
    lines += ["![output throughput](throughput.png)", "", "![TPOT and TTFT p50](latency.png)", ""]
    lines += sections
    lines += ["## Every level", ""]
    lines += [
        "| level | target | ok | errors | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | E2E p50 | backend share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in doc.levels:
        for name, t in level.targets.items():
            errors = ", ".join(f"{k} {v}" for k, v in t.stats.errors.items()) or "0"
            lines.append(
                f"| {level.label} | {name} | {t.stats.completed} | {errors} | {t.stats.request_s:.2f} | {t.stats.output_tok_s:.1f} | "
                f"{fixed(t.stats.ttft.p50)} | {fixed(t.stats.ttft.p99)} | {fixed(t.stats.tpot.p50, 2)} | {fixed(t.stats.tpot.p99, 2)} | "
                f"{fixed(t.stats.itl.p50, 2)} | {fixed(t.stats.itl.p99, 2)} | {fixed(t.stats.e2e.p50, 0)} | {share_text(t.stats.backend_share)} |"
            )
    lines += ["", "Latencies in ms. TPOT excludes the first token; ITL is per token (a chunk of k tokens counts k gaps of 1/k), as SGLang's bench_serving.", ""]
    lines += traffic_markdown(doc)
    lines += health_markdown(doc)
    return "\n".join(lines) + "\n"


def workload_text(doc: ResultsDocument) -> str:
    """report.md's sentence on what was sent: the dataset and its options, lengths, arrivals, tiers, SLOs."""
    s = doc.settings
    dataset = dict(s["dataset"])
    name = dataset.pop("name")
    options = ", ".join(f"{k} {v}" for k, v in dataset.items() if v is not None)
    parts = [doc.mode, f"dataset `{name}`" + (f" ({options})" if options else "")]
    if name in ("random", "multi-turn"):
        per_turn = " per turn" if name == "multi-turn" else ""
        parts.append(f"{s['requests_per_level']} requests per level, input {s['input_len']} / output {s['output_len']} tokens{per_turn}")
    if name != "trace":
        lengths = {"uniform": f"uniform (range ratio {s['range_ratio']})",
                   "lognormal": f"lognormal (median {s['length_median_ratio']} x the mean)"}
        parts.append(f"lengths {lengths.get(s['length_dist'], s['length_dist'])}")
        if doc.mode == "open-loop":
            parts.append("Poisson arrivals" if s["burstiness"] == 1.0 else f"gamma arrivals of burstiness {s['burstiness']}")
    if s["tier_mix"]:
        parts.append(f"service tiers {s['tier_mix']}")
    slos = [f"{label} <= {s[key]:g} ms" for label, key in (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms")) if s[key]]
    if slos:
        parts.append("goodput SLOs " + " and ".join(slos))
    parts.append(f"{s['endpoint']} endpoint, {'streamed' if s['stream'] else 'not streamed'}, `ignore_eos` so every "
                 "response has exactly the requested length")
    return "; ".join(parts) + "."


def traffic_markdown(doc: ResultsDocument) -> list[str]:
    """report.md's section on what the traffic got: offered load, goodput, cache hits, each tier (files that have them)."""
    rows = [(lv, name, t.stats, t.stats.traffic) for lv in doc.levels for name, t in lv.targets.items() if t.stats.traffic]
    if not rows:
        return []
    lines = [
        "## Traffic", "",
        "| level | target | offered req/s | req/s | goodput req/s | cache hit | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | E2E p50 | E2E p99 | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, st, traffic in rows:
        hit = "-" if traffic.cache_hit_rate is None else f"{traffic.cache_hit_rate:.1%}"
        lines.append(
            f"| {level.label} | {name} | {fixed(level.offered_request_s, 2)} | {st.request_s:.2f} | "
            f"{fixed(traffic.goodput_request_s, 2)} | {hit} | {st.output_tok_s:.1f} | {fixed(st.ttft.p50)} | "
            f"{fixed(st.ttft.p99)} | {fixed(st.tpot.p50, 2)} | {fixed(st.e2e.p50, 0)} | {fixed(st.e2e.p99, 0)} | {st.failed} |"
        )
    lines += [
        "",
        "Offered req/s: the requests per second an open-loop level's arrivals offered (the level's rate; a trace's "
        "requests over their span), on the clock req/s is measured on, so req/s / offered shows whether the target "
        "kept up. Goodput: requests per second that met every SLO set. Cache hit: prompt tokens the server reported "
        "cached (`usage.prompt_tokens_details.cached_tokens`; SGLang reports them with `--enable-cache-report`, "
        "otherwise they read 0) over prompt tokens. Latencies in ms.",
        "",
    ]
    tiers = [(lv, name, tier, ts) for lv, name, _, traffic in rows for tier, ts in (traffic.tiers or {}).items()]
    if tiers:
        lines += [
            "| level | target | tier | requests | ok | goodput req/s | TTFT p50 | TTFT p99 | TPOT p50 | E2E p50 | E2E p99 |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {lv.label} | {name} | {tier} | {ts.requests} | {ts.completed} | {fixed(ts.goodput_request_s, 2)} | "
            f"{fixed(ts.ttft_p50_ms)} | {fixed(ts.ttft_p99_ms)} | {fixed(ts.tpot_p50_ms, 2)} | {fixed(ts.e2e_p50_ms, 0)} | "
            f"{fixed(ts.e2e_p99_ms, 0)} |"
            for lv, name, tier, ts in tiers
        ]
        lines.append("")
    return lines


def share_text(share: Mapping[str, float] | None) -> str:
    """`eagle 60%, plain 40%`, or `-` when the server did not say."""
    return ", ".join(f"{k} {v:.0%}" for k, v in (share or {}).items()) or "-"


def health_markdown(doc: ResultsDocument) -> list[str]:
    """How the load generator was checked not to be the bottleneck, with the measured figures."""
    h = doc.health
    lim = h.limits
    slip = "not exported" if h.worst_sim_step_lateness_ms is None else f"{h.worst_sim_step_lateness_ms:.2f} ms"
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
        f"Worst over the run: loop lag p99 {h.worst_loop_lag_p99_ms:.2f} ms, load generator CPU "
        f"{h.worst_loadgen_cpu_pct:.0f}%, machine {h.worst_machine_busy_pct:.0f}% busy, simulator mean step "
        f"lateness {slip}."
    )
    if h.worst_balancer_cpu_pct is not None:
        worst += (
            f" The data-parallel baselines' balancer used at most {h.worst_balancer_cpu_pct:.0f}% of a core "
            f"(limit {lim.get('balancer_cpu_pct')}%)."
        )
    lines = ["## Was the load generator the bottleneck?", "", method, "", worst, ""]
    if h.flagged:
        lines += ["Levels over a limit (treat their latencies with care):", ""]
        lines += [f"- {f}" for f in h.flagged]
    else:
        lines.append("No level crossed a limit.")
    lines.append("")
    balancer = h.worst_balancer_cpu_pct is not None  # a column only where a balancer ran
    lines += [
        "| level | target | loop lag p99 ms | loadgen CPU % | gateway CPU % | " + ("balancer CPU % | " if balancer else "")
        + "sims CPU % | machine busy % | sim step lateness ms |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if balancer else ""),
    ]
    for level in doc.levels:
        for name, t in level.targets.items():
            cpu = t.monitor.cpu
            slips = t.monitor.sim_lateness_ms()
            lines.append(
                f"| {level.label} | {name} | {fixed(t.monitor.loop_lag_p99_ms, 2)} | {fixed(cpu.get('loadgen_cpu_pct'), 0)} | "
                f"{fixed(cpu.get('gateway_cpu_pct'), 0)} | " + (f"{fixed(cpu.get('balancer_cpu_pct'), 0)} | " if balancer else "")
                + f"{fixed(cpu.get('sims_cpu_pct'), 0)} | {fixed(cpu.get('machine_busy_pct'), 0)} | "
                f"{fixed(max(slips) if slips else None, 2)} |"
            )
    lines.append("")
    return lines


def write_all(doc: ResultsDocument, out_dir: Path, sections: Sequence[str] = ()) -> None:
    """Write results.json, results.csv, throughput.png, latency.png and report.md into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_bytes(doc.dumps())
    write_csv(doc, out_dir / "results.csv")
    plot_throughput(doc, out_dir / "throughput.png")
    plot_latency(doc, out_dir / "latency.png")
    (out_dir / "report.md").write_text(markdown(doc, sections))
