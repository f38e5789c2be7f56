"""What the gateway notes of one proxied exchange, for its spans and its access-log line.

`Telemetry` is one process's tracer (tracing.py) and access log (access_log.py), either of which
may be off; it exists only while one is on, so with both off the proxy does nothing for it. Each
request gets an `ExchangeRecord` (`begin`), which the proxy calls at the exchange's steps (routing,
each upstream attempt, the response's start) and at its end with the `Outcome`; only a sampled
request notes times. The end writes the access-log line and hands a sampled request's spans over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from gateway.config import Settings
from gateway.telemetry.access_log import AccessLog, sink_for
from gateway.telemetry.tracing import SpanRecord, Trace, Tracing, new_span_id

# The routing decision's span attributes. Prefix tokens: the prompt tokens the chosen backend is
# expected to hold in its prefix cache; 0 until a policy predicts cache hits.
ROUTE_POLICY, ROUTE_RULE, ROUTE_BACKEND = "specgate.route.policy", "specgate.route.rule", "specgate.route.backend"
ROUTE_GROUP, ROUTE_MODE = "specgate.route.group", "specgate.route.mode"
ROUTE_PREDICTED_TPOT, ROUTE_PREFIX_TOKENS = "specgate.route.predicted_tpot_ms", "specgate.route.prefix_tokens_expected"


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs several times more, per request
class Outcome:
    """How an exchange ended, as the proxy saw it (None: it did not get that far); built once, read once."""

    status: int  # what the client got; 499: it left first
    backend: str | None = None
    group: str | None = None
    speculative: bool | None = None
    rule: str | None = None  # the rule of the decision that placed it (failover_retry after a failover)
    failover: bool = False
    predicted_tpot: float | None = None  # seconds; the policy's, for the backend it chose (sampled requests)
    upstream_status: int | None = None
    usage: dict[str, Any] | None = None
    first_token_at: float | None = None  # time.monotonic(); streams only
    token_chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None  # how the upstream exchange failed, when it did
    client_gone: bool = False


class Telemetry:
    """One process's tracing and access log; `from_settings` is None when both are off."""

    def __init__(self, tracing: Tracing | None, access_log: AccessLog | None, policy: str) -> None:
        self.tracing = tracing
        self.access_log = access_log
        self.policy = policy  # the routing policy's name, for the decision's span

    @classmethod
    def from_settings(cls, settings: Settings, policy: str) -> Telemetry | None:
        """What `[telemetry]` and `[logging]` turn on (starting their threads), or None."""
        tracing = Tracing(settings.telemetry) if settings.telemetry.otlp_endpoint else None
        sink = sink_for(settings.logging)
        if tracing is None and sink is None:
            return None
        return cls(tracing, AccessLog(sink) if sink is not None else None, policy)

    def begin(self, request_id: str, route: str, model: str | None, tenant: str | None, tier: str, arrived_at: float,
              headers: Iterable[tuple[bytes, bytes]]) -> ExchangeRecord:
        """The record of a request that arrived at `arrived_at` (time.monotonic()) with these headers."""
        trace = None
        if self.tracing is not None:
            parent = state = None
            for name, value in headers:
                if name == b"traceparent":
                    parent = value
                elif name == b"tracestate":
                    state = value
            trace = self.tracing.trace(parent, state)
        return ExchangeRecord(self, trace, request_id, route, model, tenant, tier, arrived_at)

    async def close(self) -> None:
        """Send the queued spans and write the queued lines, in threads."""
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)
        if self.access_log is not None:
            await asyncio.to_thread(self.access_log.close)


class ExchangeRecord:
    """One request's notes; every method is cheap, and does nothing timed unless the request is sampled."""

    __slots__ = (
        "_telemetry", "_trace", "_timed", "request_id", "route", "model", "tenant", "tier", "arrived_at",
        "_offset", "_route", "_attempts", "_relay_at",
    )

    def __init__(self, telemetry: Telemetry, trace: Trace | None, request_id: str, route: str, model: str | None,
                 tenant: str | None, tier: str, arrived_at: float) -> None:
        self._telemetry = telemetry
        self._trace = trace
        self._timed = trace is not None and trace.sampled
        self.request_id, self.route, self.model, self.tenant, self.tier = request_id, route, model, tenant, tier
        self.arrived_at = arrived_at
        self._offset = 0  # monotonic -> epoch ns, and the times below: sampled requests only
        self._route: list[int] = []  # routing's start and end
        self._attempts: list[list[Any]] = []  # per upstream attempt: span id, backend, start, end, failure
        self._relay_at = 0
        if self._timed:
            self._offset = time.time_ns() - time.monotonic_ns()

    @property
    def sampled(self) -> bool:
        """Whether this request's spans are recorded."""
        return self._timed

    @property
    def wants_outcome(self) -> bool:
        """Whether `finish` does anything with the outcome: a log line to write, or spans."""
        return self._timed or self._telemetry.access_log is not None

    def admitting(self) -> None:
        """Admission (limits, the policy's decision, the slot) starts."""
        if self._timed:
            self._route.append(time.time_ns())

    def admitted(self) -> None:
        """Admission ended, placed or refused."""
        if self._timed:
            self._route.append(time.time_ns())

    def upstream_header(self, backend: str) -> bytes:
        """An upstream attempt to `backend` starts: the head lines that carry the trace to it (b"" without tracing)."""
        if self._trace is None:
            return b""
        span_id = new_span_id()
        if self._timed:
            self._attempts.append([span_id, backend, time.time_ns(), 0, None])
        return self._trace.upstream_header(span_id)

    def attempt_failed(self, reason: str) -> None:
        """The last upstream attempt failed before a response (`reason`); a failover may follow."""
        if self._timed and self._attempts:
            self._attempts[-1][3:] = [time.time_ns(), reason]

    def responding(self) -> None:
        """The response's head goes to the client: the relay starts."""
        if self._timed:
            self._relay_at = time.time_ns()

    def finish(self, outcome: Outcome) -> None:
        """The exchange ended: its access-log line, and its spans when sampled."""
        telemetry, o, trace = self._telemetry, outcome, self._trace
        now = time.monotonic()
        if telemetry.access_log is not None:  # raw values: the writer thread formats them
            ttft = o.first_token_at
            telemetry.access_log.record((
                time.time() - (now - self.arrived_at), now - self.arrived_at, None if ttft is None else ttft - self.arrived_at,
                self.request_id, None if trace is None else trace.trace_id, self.tenant, self.route, self.model, o.backend,
                o.group, o.speculative, self.tier, o.rule, o.status, o.usage, o.failover, o.client_gone, o.error,
            ))
        if self._timed and telemetry.tracing is not None and trace is not None:
            usage = o.usage or {}
            details = usage.get("prompt_tokens_details")
            cached = (details.get("cached_tokens") if isinstance(details, dict) else None) or 0
            telemetry.tracing.export(trace, self._spans(o, usage.get("prompt_tokens"), cached, usage.get("completion_tokens"), now))

    @property
    def trace_id(self) -> str | None:
        """The trace's id (32 hex digits); None without tracing."""
        return None if self._trace is None else f"{self._trace.trace_id:032x}"

    def _spans(self, o: Outcome, prompt: Any, cached: int, completion: Any, now: float) -> list[SpanRecord]:
        end = self._offset + int(now * 1e9)
        root = new_span_id()
        attrs: dict[str, AttributeValue] = {
            "http.request.method": "POST", "url.path": self.route, "http.response.status_code": o.status,
            "specgate.request_id": self.request_id, "specgate.service_tier": self.tier, "specgate.client_gone": o.client_gone,
        }
        if self.model is not None:
            attrs["gen_ai.request.model"] = self.model
        if self.tenant is not None:
            attrs["specgate.tenant"] = self.tenant
        server_error = f"HTTP {o.status}" if o.status >= 500 else None
        spans = [SpanRecord(f"POST {self.route}", root, None, SpanKind.SERVER, self._offset + int(self.arrived_at * 1e9), end, attrs, server_error)]
        if len(self._route) == 2:
            decision: dict[str, AttributeValue] = {ROUTE_POLICY: self._telemetry.policy}
            if o.backend is not None:
                decision |= {ROUTE_RULE: o.rule or "", ROUTE_BACKEND: o.backend, ROUTE_GROUP: o.group or "",
                             ROUTE_MODE: _mode(o.speculative) or "", ROUTE_PREFIX_TOKENS: 0}
            if o.predicted_tpot is not None:
                decision[ROUTE_PREDICTED_TPOT] = o.predicted_tpot * 1e3
            refused = f"HTTP {o.status}" if o.backend is None else None
            spans.append(SpanRecord("route", new_span_id(), root, SpanKind.INTERNAL, self._route[0], self._route[1], decision, refused))
        for i, (span_id, backend, start, stop, failure) in enumerate(self._attempts):
            upstream: dict[str, AttributeValue] = {"specgate.backend": backend, "specgate.failover": i > 0}
            events: tuple[tuple[str, int], ...] = ()
            if failure is None:  # the attempt that answered
                if o.upstream_status is not None:
                    upstream["http.response.status_code"] = o.upstream_status
                if prompt is not None:
                    upstream |= {"gen_ai.usage.input_tokens": prompt, "gen_ai.usage.cached_tokens": cached}
                if completion is not None:
                    upstream["gen_ai.usage.output_tokens"] = completion
                if o.finish_reason is not None:
                    upstream["gen_ai.response.finish_reasons"] = (o.finish_reason,)
                if o.first_token_at is not None:
                    events = (("first_token", self._offset + int(o.first_token_at * 1e9)),)
                failure, stop = o.error, end
            spans.append(SpanRecord("upstream", span_id, root, SpanKind.CLIENT, start, stop, upstream, failure, events))
        if self._relay_at:
            relay: dict[str, AttributeValue] = {"specgate.token_chunks": o.token_chunks}
            spans.append(SpanRecord("relay", new_span_id(), root, SpanKind.INTERNAL, self._relay_at, end, relay, o.error))
        return spans


def _mode(speculative: bool | None) -> str | None:
    return None if speculative is None else ("eagle" if speculative else "plain")
