"""The README's "Reliability" table: every figure measured, and the command that reproduces it.

Runs the reliability suite (`pytest -m reliability`, the tests record their figures with
`record_property`), then, with `--full`, the full soak (100,000 requests) and the full fuzz
(1,000 schemathesis cases); without it, the soak and fuzz rows show the suite's CI-size runs.

    python -m benchmarks.reliability_figures --full --out docs/benchmarks/reliability.md
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import click
import uvloop

from benchmarks import fuzz, soak
from benchmarks.output import publish

SUITE = "tests/reliability"
FULL_SOAK = soak.SoakSettings(requests=100_000, concurrency=256, time_scale=0.8, baseline="600s")
FULL_FUZZ_CASES, FULL_FUZZ_MUTATIONS = 1000, 500


@dataclass(frozen=True)
class TestRun:
    """One test of the suite: whether it passed, and the figures it recorded."""

    passed: bool
    figures: dict[str, str]


def run_suite(workdir: Path) -> dict[str, TestRun]:
    """Run the reliability suite; results by test name (parametrized ones keep their id)."""
    report = workdir / "suite.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "reliability", SUITE, "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}", "-o", "junit_family=xunit1"],
        check=False,
    )
    runs = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        figures = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        failed = any(child.tag in ("failure", "error") for child in case)
        runs[case.get("name", "")] = TestRun(passed=not failed, figures=figures)
    return runs


def _test(runs: dict[str, TestRun], prefix: str) -> TestRun:
    matches = [run for name, run in runs.items() if name.startswith(prefix)]
    if not matches:
        return TestRun(passed=False, figures={})
    return TestRun(passed=all(r.passed for r in matches), figures={k: v for r in matches for k, v in r.figures.items()})


def _cmd(module: str) -> str:
    return f"`pytest -m reliability {SUITE}/{module}`"


def rows(runs: dict[str, TestRun], soak_row: tuple[str, str, str, bool], fuzz_row: tuple[str, str, str, bool]) -> list[tuple[str, str, str, bool]]:
    """(what, measured, command, passed) for every figure of the table."""
    kill = _test(runs, "test_killing_a_backend")
    k = kill.figures
    hang = _test(runs, "test_hung_backend")
    h = hang.figures
    leave = _test(runs, "test_a_thousand_clients")
    d = leave.figures
    drain = _test(runs, "test_sigterm_drains")
    bounded = _test(runs, "test_drain_is_bounded")
    keys = _test(runs, "test_every_route_but_the_probes")
    leaks = _test(runs, "test_keys_never_appear")
    steer = _test(runs, "test_no_field_header")
    limits = _test(runs, "test_body_and_head_size_limits")
    slow = _test(runs, "test_slow_clients_are_all_closed")
    w = slow.figures
    return [
        ("SIGKILL one backend under closed-loop load (concurrency 64)",
         (f"{k.get('requests', '?')} requests; {k.get('failed_without_a_byte', '?')} failed that had not received a byte "
         f"({k.get('retried_on_the_other_backend', '?')} retried on the other backend); {k.get('streams_resumed', '?')} streams cut "
         f"went on on the other backend; {k.get('streams_cut', '?')} that could not (two choices) ended with an SSE error event + "
         f"`[DONE]`, the last {k.get('cut_stream_end_after_kill_ms_max', '?')} ms after the kill"),
         _cmd("test_backend_kill.py"), kill.passed),
        ("... routing after the kill and after the restart (health interval 0.5 s)",
         (f"backend marked down {k.get('down_detected_s', '?')} s after the kill; routed to again "
         f"{k.get('routing_recovered_s', '?')} s after it was ready; in-flight gauges exactly 0 after"),
         _cmd("test_backend_kill.py"), kill.passed),
        ("Hung backend (first-byte timeout 1 s, idle timeout 2 s)",
         (f"504 OpenAI error after {h.get('hung_request_504_after_s', '?')} s; running stream ended with an error event after "
         f"{h.get('hung_stream_ended_after_s', '?')} s; backend marked failing; other traffic {h.get('other_traffic_requests', '?')} "
         f"requests, {h.get('other_traffic_failed', '?')} failed"),
         _cmd("test_hung_backend.py"), hang.passed),
        ("1,000 clients leaving at random points (before headers, after the first token, mid-stream)",
         (f"{d.get('upstream_aborted', '?')} of {d.get('upstream_requests', '?')} upstream requests aborted "
         f"({d.get('upstream_finished', '?')} ran on); in-flight after: {d.get('inflight_after', '?')}"),
         _cmd("test_disconnects.py"), leave.passed),
        ("SIGTERM under load (32 streams in flight)",
         (f"{drain.figures.get('in_flight_completed', '?')}/{drain.figures.get('in_flight_at_sigterm', '?')} completed, new requests 503, "
         f"exit {drain.figures.get('exit_after_sigterm_s', '?')} s after SIGTERM, {drain.figures.get('orphans', '?')} orphan processes; "
         f"with drain timeout {bounded.figures.get('drain_timeout_s', '?')} s and an endless stream: exit after "
         f"{bounded.figures.get('exit_after_sigterm_s', '?')} s, the stream ended with an error event"),
         _cmd("test_shutdown.py"), drain.passed and bounded.passed),
        soak_row,
        fuzz_row,
        ("API keys on every route",
         (f"{keys.figures.get('routes_checked', '?')} routes x 6 bad credentials: 401 except /health, /ready (and /metrics "
         "unless `metrics_public = false`); admin routes need the admin key"),
         _cmd("test_security.py"), keys.passed),
        ("Secrets in logs and responses (debug log, SGLang-style /server_info)",
         (f"0 occurrences of the backends', client or admin keys in {leaks.figures.get('responses_checked', '?')} responses and "
         f"{leaks.figures.get('log_lines_checked', '?')} log lines"),
         _cmd("test_security.py"), leaks.passed),
        ("Steering the gateway with `model`, headers or the request target",
         (f"{steer.figures.get('steering_attempts', '?')} attempts, {steer.figures.get('connections_elsewhere', '?')} connections "
         "anywhere but the configured backends"),
         _cmd("test_security.py"), steer.passed),
        ("3,000 slowloris connections + 200 slow POSTs (client timeouts 5 s), 1 and 2 workers",
         (f"every one answered 408 and closed {w.get('closed_after_s_min_max', '?').replace('/', '-')} s after it was sent; "
         f"{w.get('legit_chats', '?')} chat completions sent one after another meanwhile, all 200, the slowest "
         f"{w.get('legit_chat_max_s', '?')} s; a streamed `openai` request completed; in-flight 0 and `client_connections` "
         f"back to idle ({w.get('client_connections_idle', '?')}) after"),
         _cmd("test_slow_clients.py"), slow.passed),
        ("Body and head size limits", ("413 over the body limit (with and without Content-Length); 431 over the head limit "
         "(one header, many headers, long URL, a 16 MiB header refused after the first bytes); nothing forwarded"),
         _cmd("test_security.py"), limits.passed),
    ]


def soak_row_of(result: soak.SoakResult, command: str) -> tuple[str, str, str, bool]:
    s = result.settings
    base, final = result.baseline, result.final
    memory = (f"RSS {base.rss / 2**20:.1f} -> {final.rss / 2**20:.1f} MiB ({100 * result.rss_growth:+.1f}%), "
              f"fds {base.fds} -> {final.fds} ({result.idle_fds} idle after)") if base and final else "no baseline"
    return (f"Soak: {s.requests:,} requests at concurrency {s.concurrency} ({result.seconds / 60:.1f} min)",
            f"{result.lost} lost, {result.refused} refused, {result.completed} completed; {memory}; baseline {soak.baseline_words(s.baseline)}",
            f"`{command}`", not result.failures())


def fuzz_row_of(result: fuzz.FuzzResult, command: str) -> tuple[str, str, str, bool]:
    return (f"Fuzzing: {result.schema_cases:,} schemathesis cases + {result.raw_cases} malformed raw-socket requests",
            (f"{len(result.gateway_5xx)} gateway 5xx, {len(result.hangs)} hangs, {len(result.bad_errors)} errors not in "
            f"OpenAI's shape, {len(result.bad_streams)} streams without `[DONE]`"),
            f"`{command}`", not result.problems())


def table(all_rows: list[tuple[str, str, str, bool]], command: str, seconds: float) -> str:
    """The markdown table and how it was made."""
    lines = [
        "# Reliability figures",
        "",
        f"Command: `{command}` ({seconds / 60:.0f} min on this machine's 2 shared cores; simulated backends)",
        "",
        "| what | measured | reproduce with | pass |",
        "|---|---|---|---|",
    ]
    lines += [f"| {what} | {measured} | {cmd} | {'yes' if ok else '**no**'} |" for what, measured, cmd, ok in all_rows]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--full", is_flag=True, help="run the 100,000-request soak and the 1,000-case fuzz (about 20 minutes)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="write the table here (and, with --full, "
              "the soak and fuzz reports beside it)")
def main(full: bool, out: Path | None) -> None:
    """Run the reliability suite (and with --full the long runs) and print the figures table."""
    command = shlex.join(["python", "-m", "benchmarks.reliability_figures", *sys.argv[1:]])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        runs = run_suite(Path(tmp))
        if full:
            soak_cmd = soak.soak_command(FULL_SOAK)
            soak_result = uvloop.run(soak.run_soak(FULL_SOAK, Path(tmp)))
            fuzz_cmd = f"python -m benchmarks.fuzz --cases {FULL_FUZZ_CASES} --mutations {FULL_FUZZ_MUTATIONS}"
            fuzz_result = fuzz.FuzzResult()
            fuzz_started = time.monotonic()
            with fuzz.fuzz_target(Path(tmp)) as (url, model):
                fuzz.fuzz_schema(url, model, FULL_FUZZ_CASES, fuzz_result)
                fuzz.fuzz_raw(url, model, FULL_FUZZ_MUTATIONS, fuzz_result)
                fuzz.settle_inflight(url, fuzz_result)
            fuzz_seconds = time.monotonic() - fuzz_started
            soak_row, fuzz_row = soak_row_of(soak_result, soak_cmd), fuzz_row_of(fuzz_result, fuzz_cmd)
        else:
            ci_soak, ci_fuzz = _test(runs, "test_soak"), _test(runs, "test_fuzzed")
            soak_row = ("Soak: 5,000 requests at concurrency 256 (CI size)",
                        (f"{ci_soak.figures.get('lost', '?')} lost; RSS growth {ci_soak.figures.get('rss_growth_percent', '?')}% "
                        f"(baseline after 20% of the requests); fds baseline/end/idle {ci_soak.figures.get('fds_baseline_end_idle', '?')}"),
                        _cmd("test_soak.py"), ci_soak.passed)
            fuzz_row = ((f"Fuzzing (CI size): {ci_fuzz.figures.get('schemathesis_cases', '?')} schemathesis cases + "
                        f"{ci_fuzz.figures.get('raw_cases', '?')} raw-socket requests"),
                        (f"{ci_fuzz.figures.get('gateway_5xx', '?')} gateway 5xx, {ci_fuzz.figures.get('hangs', '?')} hangs, "
                        f"{ci_fuzz.figures.get('errors_not_openai_shaped', '?')} errors not in OpenAI's shape"),
                        _cmd("test_fuzz.py"), ci_fuzz.passed)
    all_rows = rows(runs, soak_row, fuzz_row)
    text = table(all_rows, command, time.monotonic() - started)
    publish(text, out)
    if out is not None and full:
        (out.parent / "reliability-soak.md").write_text(soak.report(soak_result, soak_cmd))
        (out.parent / "reliability-fuzz.md").write_text(fuzz.report(fuzz_result, fuzz_cmd, fuzz_seconds))
    sys.exit(0 if all(ok for *_, ok in all_rows) else 1)


if __name__ == "__main__":
    main()
