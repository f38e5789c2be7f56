"""What the gateway notes of one proxied exchange: the trace it runs in, its spans, its access-log line.

`Telemetry` is one process's tracer (tracing.py) and access log (access_log.py), either of which may
be off; it exists only while one is on, so with both off the proxy does nothing for it. Per request
only what a feature needs is made: with tracing on, its `Trace` (`trace`), which the upstream
request carries on; when that is sampled, an `ExchangeRecord` (`record`) that the proxy tells the
exchange's steps (routing, each upstream attempt, the response's start) and its end, and which hands
the spans to the tracer. The access log takes the `Outcome` and the request's own values (`log`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from gateway.config import Settings
from gateway.telemetry.access_log import AccessLog, sink_for
from gateway.telemetry.outcome import Outcome
from gateway.telemetry.tracing import SpanRecord, Trace, Tracing, new_span_id

# The routing decision's span attributes. Prefix tokens: the prompt tokens the chosen backend is
# expected to hold in its prefix cache; 0 until a policy predicts cache hits.
ROUTE_POLICY, ROUTE_RULE, ROUTE_BACKEND = "specgate.route.policy", "specgate.route.rule", "specgate.route.backend"
ROUTE_GROUP, ROUTE_MODE = "specgate.route.group", "specgate.route.mode"
ROUTE_PREDICTED_TPOT, ROUTE_PREFIX_TOKENS = "specgate.route.predicted_tpot_ms", "specgate.route.prefix_tokens_expected"


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

    def trace(self, headers: Iterable[tuple[bytes, bytes]]) -> Trace | None:
        """The trace of a request with these headers; None without tracing."""
        if self.tracing is None:
            return None
        parent = state = None
        for name, value in headers:
            if name == b"traceparent":
                parent = value
            elif name == b"tracestate":
                state = value
        return self.tracing.trace(parent, state)

    def record(self, trace: Trace, request_id: str, route: str, model: str | None, tenant: str | None, tier: str,
               arrived_at: float) -> ExchangeRecord:
        """The span record of a sampled request that arrived at `arrived_at` (time.monotonic())."""
        return ExchangeRecord(self, trace, request_id, route, model, tenant, tier, arrived_at)

    def log(self, outcome: Outcome, request_id: str, trace: Trace | None, tenant: str | None, route: str,
            model: str | None, tier: str, arrived_at: float) -> None:
        """Queue the access-log line of a request that arrived at `arrived_at` and ended as `outcome`."""
        assert self.access_log is not None, "no access log"
        self.access_log.record((
            time.monotonic(), arrived_at, request_id, None if trace is None else trace.trace_id, tenant, route, model, tier, outcome,
        ))

    async def close(self) -> None:
        """Send the queued spans and write the queued lines, in threads."""
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)
        if self.access_log is not None:
            await asyncio.to_thread(self.access_log.close)


class ExchangeRecord:
    """A sampled request's spans in the making: the times of its steps, then `finish`."""

    __slots__ = ("_telemetry", "_trace", "request_id", "route", "model", "tenant", "tier", "arrived_at", "_offset",
                 "_route", "_attempts", "_relay_at")

    def __init__(self, telemetry: Telemetry, trace: Trace, request_id: str, route: str, model: str | None,
                 tenant: str | None, tier: str, arrived_at: float) -> None:
        self._telemetry = telemetry
        self._trace = trace
        self.request_id, self.route, self.model, self.tenant, self.tier = request_id, route, model, tenant, tier
        self.arrived_at = arrived_at
        self._offset = time.time_ns() - time.monotonic_ns()  # monotonic -> epoch ns
        self._route: list[int] = []  # routing's start and end
        # Per upstream attempt: span id, backend, start, end, failure, whether another backend went on with its stream.
        self._attempts: list[list[Any]] = []
        self._relay_at = 0

    def admitting(self) -> None:
        """Admission (limits, the policy's decision, the slot) starts."""
        self._route.append(time.time_ns())

    def admitted(self) -> None:
        """Admission ended, placed or refused."""
        self._route.append(time.time_ns())

    def upstream_header(self, backend: str) -> bytes:
        """An upstream attempt to `backend` starts: the head lines that carry the trace to it."""
        span_id = new_span_id()
        self._attempts.append([span_id, backend, time.time_ns(), 0, None, False])
        return self._trace.upstream_header(span_id)

    def attempt_failed(self, reason: str) -> None:
        """The last upstream attempt failed before a response (`reason`); a failover may follow."""
        if self._attempts:
            self._attempts[-1][3:5] = [time.time_ns(), reason]

    def handed_on(self, failure: str | None) -> None:
        """The last upstream attempt's stream stopped mid-answer and another attempt goes on with it
        (`failure`: how it broke; None: the policy moved it)."""
        if self._attempts:
            self._attempts[-1][3:] = [time.time_ns(), failure, True]

    def responding(self) -> None:
        """The response's head goes to the client: the relay starts."""
        self._relay_at = time.time_ns()

    def finish(self, outcome: Outcome) -> None:
        """The exchange ended: its spans go to the tracer."""
        tracing, usage = self._telemetry.tracing, outcome.usage or {}
        assert tracing is not None, "a span record without tracing"
        details = usage.get("prompt_tokens_details")
        cached = (details.get("cached_tokens") if isinstance(details, dict) else None) or 0
        spans = self._spans(outcome, usage.get("prompt_tokens"), cached, usage.get("completion_tokens"), time.monotonic())
        tracing.export(self._trace, spans)

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
        went_on = False  # the attempt before handed its stream on: this one continues it, not a failover
        for i, (span_id, backend, start, stop, failure, handed) in enumerate(self._attempts):
            upstream: dict[str, AttributeValue] = {"specgate.backend": backend, "specgate.failover": i > 0 and not went_on}
            if went_on:
                upstream["specgate.continues"] = True
            went_on = handed
            events: tuple[tuple[str, int], ...] = ()
            if handed:
                upstream["specgate.handed_on"] = True
            elif failure is None:  # the attempt that answered
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
