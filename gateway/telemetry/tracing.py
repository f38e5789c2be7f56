"""OpenTelemetry spans of proxied requests, sent over OTLP/HTTP from the BatchSpanProcessor's thread.

A request's trace is the client's when it sent a W3C `traceparent`, else a new one. Sampling is
OTel's parentbased_traceidratio: a client's sampled flag is followed, a new trace is recorded with
`sample_ratio`. Every request passes its trace on upstream (`upstream_header`: the upstream
attempt's span as parent, or, unsampled, flag 00 so SGLang records none either); SGLang reads
`traceparent` and `tracestate` (`srt/observability/trace.py`, `--enable-trace`). Spans are built once
the exchange ended, as SDK `ReadableSpan`s handed to the processor, whose thread encodes and posts
them: the event loop only notes timestamps. One `Tracing` per worker process.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import AttributeValue

from gateway import __version__
from gateway.config import TelemetryConfig

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# One tracestate list member (W3C trace-context: key, optionally tenant@system, "=", value).
_STATE_MEMBER = re.compile(
    r"[a-z0-9][_0-9a-z\-*/]{0,255}(?:@[a-z][_0-9a-z\-*/]{0,13})?=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_LOW_64 = (1 << 64) - 1
_SAMPLED, _UNSAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_EXPORT_TIMEOUT = 10.0  # seconds the exporter waits for the collector, in its own thread
_QUEUE = 16384  # spans waiting for export; beyond it the processor drops them (it never blocks the loop)


@dataclass(slots=True)  # not frozen: made for every request, and a frozen __init__ costs more
class Trace:
    """The trace one request runs in: its id, the client's span (None: the trace starts here), whether it is recorded."""

    trace_id: int
    parent: SpanContext | None
    sampled: bool

    def upstream_header(self, span_id: int) -> bytes:
        """The head lines that pass the trace on, as the child of span `span_id` (an unsampled request:
        the client's own span, or a new id)."""
        if not self.sampled and self.parent is not None:
            span_id = self.parent.span_id
        flags = b"01" if self.sampled else b"00"
        line = b"traceparent: 00-%032x-%016x-%s\r\n" % (self.trace_id, span_id, flags)
        state = self.parent.trace_state if self.parent is not None else None
        return line + b"tracestate: %s\r\n" % state.to_header().encode() if state else line


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span, as the exchange noted it (times in ns since the epoch)."""

    name: str
    span_id: int
    parent_id: int | None  # None: the request's own span (its parent is the client's, if any)
    kind: SpanKind
    start: int
    end: int
    attributes: dict[str, AttributeValue]
    error: str | None = None  # the span's status description when it failed
    events: tuple[tuple[str, int], ...] = ()  # (name, time)


def new_span_id() -> int:
    """A random, non-zero 64-bit span id."""
    return random.getrandbits(64) or 1


class Tracing:
    """One process's tracer: parses client contexts, decides sampling, hands finished spans to the exporter."""

    def __init__(self, config: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
        """`exporter`: OTLP/HTTP to `config.otlp_endpoint` unless given (tests pass their own)."""
        assert exporter is not None or config.otlp_endpoint, "tracing needs an OTLP endpoint"
        self._resource = Resource.create({SERVICE_NAME: config.service_name})
        self._scope = InstrumentationScope("specgate", __version__)
        self._bound = TraceIdRatioBased.get_bound_for_rate(config.sample_ratio)
        exporter = exporter or OTLPSpanExporter(endpoint=config.otlp_endpoint, timeout=_EXPORT_TIMEOUT)
        self._processor = BatchSpanProcessor(exporter, max_queue_size=_QUEUE, schedule_delay_millis=1000)

    def trace(self, traceparent: bytes | None, tracestate: bytes | None) -> Trace:
        """The trace of a request with these headers (an invalid `traceparent` counts as none, as W3C says)."""
        parent = _parent(traceparent, tracestate) if traceparent is not None else None
        if parent is not None:
            return Trace(parent.trace_id, parent, parent.trace_flags.sampled)
        trace_id = random.getrandbits(128) or 1
        return Trace(trace_id, None, (trace_id & _LOW_64) < self._bound)

    def export(self, trace: Trace, spans: Sequence[SpanRecord]) -> None:
        """Queue a sampled request's spans for the exporter's thread."""
        state = trace.parent.trace_state if trace.parent is not None else TraceState()
        contexts = {s.span_id: SpanContext(trace.trace_id, s.span_id, False, _SAMPLED, state) for s in spans}
        for s in spans:
            parent = trace.parent if s.parent_id is None else contexts[s.parent_id]
            status = Status(StatusCode.ERROR, s.error) if s.error is not None else Status(StatusCode.UNSET)
            self._processor.on_end(
                ReadableSpan(
                    name=s.name,
                    context=contexts[s.span_id],
                    parent=parent,
                    resource=self._resource,
                    attributes=s.attributes,
                    events=[Event(name, timestamp=at) for name, at in s.events],
                    kind=s.kind,
                    status=status,
                    start_time=s.start,
                    end_time=s.end,
                    instrumentation_scope=self._scope,
                )
            )

    def shutdown(self) -> None:
        """Send what is queued and stop the exporter's thread (blocks: call it off the event loop)."""
        self._processor.shutdown()


def _parent(traceparent: bytes, tracestate: bytes | None) -> SpanContext | None:
    """The client's span from W3C trace-context headers; None when `traceparent` is not valid."""
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if version == b"ff" or (version == b"00" and rest) or not trace_id or not span_id:
        return None
    state = _state(tracestate) if tracestate else TraceState()
    return SpanContext(trace_id, span_id, True, TraceFlags(int(flags, 16) & TraceFlags.SAMPLED), state)


def _state(header: bytes) -> TraceState:
    """A valid `tracestate` as is; an invalid one is dropped whole, as W3C says (and unlogged)."""
    members = [m.strip() for m in header.decode("latin-1").split(",") if m.strip()]
    if len(members) > 32 or not all(_STATE_MEMBER.fullmatch(m) for m in members):
        return TraceState()
    return TraceState.from_header([",".join(members)])
