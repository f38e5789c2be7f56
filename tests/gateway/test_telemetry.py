"""Telemetry without a gateway: W3C trace context, sampling, the spans of one exchange, the access log and its files."""

from __future__ import annotations

import json
import os
import random
import select
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.config import LoggingConfig, Settings, TelemetryConfig
from gateway.telemetry import access_log, log_file
from gateway.telemetry.access_log import FIELDS, AccessLog, Line, sink_for
from gateway.telemetry.log_file import Descriptor, RotatingFile, write_lines
from gateway.telemetry.outcome import Outcome
from gateway.telemetry.record import Telemetry
from gateway.telemetry.tracing import Tracing

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def tracing(ratio: float = 1.0) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return Tracing(TelemetryConfig(sample_ratio=ratio), exporter), exporter


@pytest.mark.parametrize(
    ("header", "valid"),
    [
        (f"00-{TRACE}-{SPAN}-01", True),
        (f"00-{TRACE}-{SPAN}-00", True),
        (f"01-{TRACE}-{SPAN}-01-future", True),  # a later version may add fields
        (f"00-{TRACE}-{SPAN}-01-extra", False),  # version 00 has exactly four
        (f"ff-{TRACE}-{SPAN}-01", False),
        (f"00-{'0' * 32}-{SPAN}-01", False),
        (f"00-{TRACE}-{'0' * 16}-01", False),
        (f"00-{TRACE.upper()}-{SPAN}-01", False),
        ("garbage", False),
    ],
)
def test_a_clients_traceparent_is_followed_only_when_valid(header: str, valid: bool) -> None:
    trace = tracing(ratio=0.0)[0].trace(header.encode(), None)
    assert (f"{trace.trace_id:032x}" == TRACE) is valid
    assert trace.sampled is (valid and header.split("-")[3] == "01")  # its flag decides, not the ratio


def test_new_traces_are_sampled_at_the_ratio() -> None:
    random.seed(7)
    tracer = tracing(ratio=0.25)[0]
    share = sum(tracer.trace(None, None).sampled for _ in range(4000)) / 4000
    assert 0.22 < share < 0.28
    assert all(tracing(ratio=1.0)[0].trace(None, None).sampled for _ in range(100))


def test_the_upstream_header_carries_the_trace_and_a_valid_tracestate() -> None:
    tracer = tracing()[0]
    sampled = tracer.trace(f"00-{TRACE}-{SPAN}-01".encode(), b"vendor=abc, other=x")
    assert sampled.upstream_header(0xABC) == f"traceparent: 00-{TRACE}-{0xABC:016x}-01\r\ntracestate: vendor=abc,other=x\r\n".encode()
    unsampled = tracer.trace(f"00-{TRACE}-{SPAN}-00".encode(), b"not valid ;;; x")
    assert unsampled.upstream_header(0xABC) == f"traceparent: 00-{TRACE}-{SPAN}-00\r\n".encode()  # no span of its own


def test_a_failed_over_exchange_gives_four_spans_and_two_attempts() -> None:
    tracer, exporter = tracing()
    telemetry = Telemetry(tracer, None, "threshold")
    trace = telemetry.trace([(b"traceparent", f"00-{TRACE}-{SPAN}-01".encode())])
    assert trace is not None and trace.sampled and f"{trace.trace_id:032x}" == TRACE
    record = telemetry.record(trace, "rid-1", "/v1/completions", "m", "acme", "default", 100.0)
    record.admitting()
    record.admitted()
    record.upstream_header("eagle")
    record.attempt_failed("ConnectFailed")
    record.upstream_header("plain")
    record.responding()
    record.finish(Outcome(200, "plain", "g1", False, "failover_retry", True, 0.0125, 200,
                          {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
                          finish_reason="stop"))
    tracer.shutdown()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["POST /v1/completions", "route", "upstream", "upstream", "relay"]
    root, route, failed, served, relay = spans
    assert root.parent is not None and f"{root.parent.span_id:016x}" == SPAN and root.kind == SpanKind.SERVER
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in spans[1:])
    assert route.attributes is not None and dict(route.attributes) == {
        "specgate.route.policy": "threshold", "specgate.route.rule": "failover_retry",
        "specgate.route.backend": "plain", "specgate.route.group": "g1", "specgate.route.mode": "plain",
        "specgate.route.prefix_tokens_expected": 0, "specgate.route.predicted_tpot_ms": 12.5,
    }
    assert failed.status.status_code == StatusCode.ERROR and failed.status.description == "ConnectFailed"
    assert failed.attributes == {"specgate.backend": "eagle", "specgate.failover": False}
    assert served.attributes is not None and served.attributes["specgate.failover"] is True
    assert served.attributes["gen_ai.usage.cached_tokens"] == 4 and served.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert served.status.status_code == StatusCode.UNSET and relay.kind == SpanKind.INTERNAL


def test_a_stream_handed_on_gives_an_attempt_per_backend_the_first_ended_where_it_stopped() -> None:
    tracer, exporter = tracing()
    telemetry = Telemetry(tracer, None, "adaptive")
    trace = telemetry.trace([(b"traceparent", f"00-{TRACE}-{SPAN}-01".encode())])
    assert trace is not None
    record = telemetry.record(trace, "rid-2", "/v1/chat/completions", "m", None, "default", 100.0)
    record.upstream_header("eagle")
    record.responding()
    record.handed_on(None)  # the policy moved it
    record.upstream_header("plain")
    record.finish(Outcome(200, "plain", "g0", False, "adaptive_predicted_faster", usage={"completion_tokens": 9}, moved_from="eagle"))
    tracer.shutdown()
    first, second = [s for s in exporter.get_finished_spans() if s.name == "upstream"]
    assert first.attributes is not None and first.attributes["specgate.handed_on"] is True
    assert first.status.status_code == StatusCode.UNSET and first.end_time is not None and second.end_time is not None
    assert first.end_time <= second.start_time  # type: ignore[operator]
    assert second.attributes is not None and second.attributes["gen_ai.usage.output_tokens"] == 9
    assert second.attributes["specgate.continues"] is True and second.attributes["specgate.failover"] is False


def test_an_unsampled_new_trace_is_passed_on_unsampled_and_tracing_off_reads_no_trace() -> None:
    trace = Telemetry(tracing(ratio=0.0)[0], None, "adaptive").trace([(b"host", b"gw")])
    assert trace is not None and not trace.sampled and trace.upstream_header(5).endswith(b"-0000000000000005-00\r\n")
    logged: list[bytes] = []
    assert Telemetry(None, AccessLog(_Capture(logged)), "adaptive").trace([(b"traceparent", f"00-{TRACE}-{SPAN}-01".encode())]) is None


def test_both_off_means_no_telemetry_at_all() -> None:
    settings = Settings.model_validate({"logging": {"access_log": "off"}})
    assert Telemetry.from_settings(settings, "adaptive") is None
    assert sink_for(LoggingConfig()) is not None  # the default: stdout


class _Capture:
    def __init__(self, out: list[bytes]) -> None:
        self.out = out

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        self.out.append(b"<closed>")


def test_the_access_log_writes_every_line_as_json_in_field_order_before_closing() -> None:
    out: list[bytes] = []
    log = AccessLog(_Capture(out))
    telemetry = Telemetry(None, log, "adaptive")
    for i in range(500):
        outcome = Outcome(429 if i % 2 else 200, usage={"prompt_tokens": 5, "completion_tokens": i})
        telemetry.log(outcome, f"rid-{i}", None, "acme" if i % 2 else None, "/v1/chat/completions", "m", "default", 100.0 + i)
    log.close()
    assert out[-1] == b"<closed>"
    lines = [json.loads(line) for chunk in out[:-1] for line in chunk.splitlines()]
    assert [line["request_id"] for line in lines] == [f"rid-{i}" for i in range(500)]
    assert list(lines[3]) == list(FIELDS)
    assert (lines[3]["status"], lines[3]["tenant"], lines[3]["completion_tokens"], lines[3]["cached_tokens"]) == (429, "acme", 3, 0)
    assert lines[0]["time"].endswith("Z") and lines[0]["trace_id"] is None and lines[0]["ttft_ms"] is None


def test_a_line_holds_the_requests_values_exactly() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 6}}
    outcome = Outcome(200, "eagle", "g0", True, "threshold_low", False, 0.01, 200, usage, 0.25 + 0.0012344, 3, "stop")
    line = Line()(1_700_000_000.0, 0.25 + 0.0123456, 0.25, "rid", int(TRACE, 16), "acme", "/v1/chat/completions", "m", "flex", outcome)
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "time": "2023-11-14T22:13:20.250Z", "request_id": "rid", "trace_id": TRACE, "tenant": "acme",
        "route": "/v1/chat/completions", "model": "m", "backend": "eagle", "group": "g0", "mode": "eagle", "tier": "flex",
        "rule": "threshold_low", "status": 200, "prompt_tokens": 9, "cached_tokens": 6, "completion_tokens": 4,
        "ttft_ms": 1.234, "e2e_ms": 12.346, "failover": False, "moved_from": None, "client_gone": False, "error": None,
    }
    refused = json.loads(Line()(1_700_000_000.0, 0.999, 0.9985, "r2", None, None, "/v1/completions", None, "default", Outcome(503)))
    assert (refused["time"], refused["mode"], refused["prompt_tokens"], refused["cached_tokens"]) == ("2023-11-14T22:13:20.998Z", None, None, None)
    assert (refused["e2e_ms"], refused["ttft_ms"], refused["backend"]) == (0.5, None, None)


def test_lines_recorded_across_batches_are_written_in_order_and_the_last_ones_at_close() -> None:
    out: list[bytes] = []
    log = AccessLog(_Capture(out))
    telemetry = Telemetry(None, log, "adaptive")
    for i in range(30):
        telemetry.log(Outcome(200), f"rid-{i}", None, None, "/v1/completions", None, "default", time.monotonic())
        if i % 10 == 9:
            time.sleep(access_log.FLUSH_SECONDS * 1.5)  # the writer has written a batch meanwhile
    telemetry.log(Outcome(200), "last", None, None, "/v1/completions", None, "default", time.monotonic())
    log.close()  # at once: well within FLUSH_SECONDS of the last line
    assert len(out) > 2 and out[-1] == b"<closed>"
    assert [json.loads(line)["request_id"] for chunk in out[:-1] for line in chunk.splitlines()] == [f"rid-{i}" for i in range(30)] + ["last"]


def test_lines_are_written_in_whole_line_pieces_no_longer_than_a_pipe_takes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    monkeypatch.setattr(log_file.os, "write", lambda fd, data: writes.append(bytes(data)) or len(data))
    lines = b"".join(b"%05d" % i + b"x" * 90 + b"\n" for i in range(200)) + b"y" * 9000 + b"\n"
    write_lines(1, lines)
    assert b"".join(writes) == lines
    assert all(w.endswith(b"\n") for w in writes)
    assert all(len(w) <= select.PIPE_BUF for w in writes[:-1]) and len(writes[-1]) == 9001  # a longer line alone


def test_a_file_rotated_by_two_writers_keeps_every_line_and_the_backups(tmp_path: Path) -> None:
    path = str(tmp_path / "access.log")
    workers = [RotatingFile(path, max_bytes=4096, backups=3), RotatingFile(path, max_bytes=4096, backups=3)]
    written = [b'{"n": %d}' % i + b" " * 200 + b"\n" for i in range(100)]

    def write(worker: int) -> None:
        for line in written[worker::2]:
            workers[worker].write(line)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for worker in workers:
        worker.close()
    files = sorted(os.listdir(tmp_path))
    assert files == ["access.log", "access.log.1", "access.log.2", "access.log.3", "access.log.lock"]
    kept = [line for name in files if not name.endswith(".lock") for line in (tmp_path / name).read_bytes().splitlines(keepends=True)]
    assert all(line in written for line in kept)  # whole lines only
    assert len(set(kept)) == len(kept)
    # A file ends at the line that took it past the size, plus a line the other writer had under way.
    assert all(os.path.getsize(tmp_path / name) < 4096 + 3 * len(written[0]) for name in files if name.endswith(("1", "2", "3")))
    numbers = {json.loads(line)["n"] for line in kept}
    # Each writer's newest line kept, and the oldest file dropped. Which lines that file held depends on
    # the threads' interleaving: run one after the other, the second appends its first lines to the
    # first's last file (line 0 then survives, behind line 99).
    assert {98, 99} <= numbers and len(kept) < len(written)


def test_stdout_is_a_descriptor_the_log_does_not_close() -> None:
    read, write = os.pipe()
    sink = Descriptor(write)
    sink.write(b"one\n")
    sink.close()
    os.write(write, b"two\n")  # still open
    os.close(write)
    assert os.read(read, 100) == b"one\ntwo\n"
    os.close(read)
