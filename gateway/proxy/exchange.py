"""One proxied generation request, from its admission (`admission.py`) to the last byte sent to the client.

`ProxyResponse` is an ASGI response that owns the whole upstream exchange, so everything tied to the
request's lifetime lives in one `try/finally`: the in-flight slot (released there and nowhere
else), the upstream connection and the metrics. What a response teaches the policy (its decode
window and the load it ran under, and every few chunks its pace so far) is measured by the slot; a
response not streamed teaches its life and usage alone. When the client leaves first (even while
SGLang is still queueing or prefilling and has sent no header yet) the exchange is cancelled, which
closes the upstream connection, which makes SGLang abort the request. With tracing on, the request's
trace goes upstream and a sampled one's `ExchangeRecord` (gateway/telemetry) is told the exchange's
steps; its `Outcome` goes to that record and to the access log. A stream the policy moves, or whose
backend drops it, goes on on another backend from its text so far (`continuation.py`), one answer
for the client; moved before its backend began the response, it is sent to the other one whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.dialects.openai import echo_json, stream_echo
from gateway.edge.body_writer import BodyWriter, body_writer
from gateway.edge.client_watch import watch_client
from gateway.errors import OpenAIError
from gateway.policies import FAILOVER, Completion, Running
from gateway.pool.backends import Backend, Slot
from gateway.proxy.admission import admit, continue_on, fail_over, resend_on, resume_on
from gateway.proxy.cancel import ExchangeCancel
from gateway.proxy.continuation import continuation
from gateway.proxy.drain import response_ended
from gateway.proxy.job import ProxyJob
from gateway.proxy.rate_limits import quota_headers
from gateway.relay import Handoff, StreamResult
from gateway.relay.gaps import GapBuffer
from gateway.relay.sse import kept_text
from gateway.runtime import Runtime
from gateway.telemetry.outcome import Outcome
from gateway.telemetry.record import ExchangeRecord
from gateway.telemetry.tracing import Trace, new_span_id
from gateway.tiers import tier_header
from gateway.upstream.errors import BadResponse, ConnectFailed, WireError, local_kind
from gateway.upstream.http11 import WireResponse

log = logging.getLogger("specgate.proxy")

CLIENT_GONE = "499"  # nginx's convention for "client closed request", as a status label
UNROUTED = "none"  # backend label of requests refused before routing (draining, overload, none ready)
# How a stream can fail that another backend can still finish: its backend dropped or stalled it.
_RESUMABLE = ("disconnected", "truncated", "idle_timeout")
_MOVE_FAILED = OpenAIError(502, "no backend could go on with the answer", code="upstream_unreachable", type="server_error")


def _nothing(_: float) -> None:
    pass


def _headers(job: ProxyJob, slot: Slot, content_type: bytes, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", content_type),
        (b"x-specgate-backend", slot.backend.name.encode()),
        (b"x-request-id", job.request_id.encode()),
        tier_header(job.tier),
    ]
    if slot.lease is not None:  # its tenant's buckets, as OpenAI reports them on every response
        headers += [(k.encode(), v.encode()) for k, v in quota_headers(slot.lease.requests, slot.lease.tokens)]
    return headers + extra


class ProxyResponse(Response):
    """Routes, proxies and relays one generation request (chat, completions or native /generate)."""

    def __init__(self, runtime: Runtime, job: ProxyJob) -> None:
        super().__init__()
        self._rt = runtime
        self._job = job
        self._slot: Slot | None = None
        self._status = CLIENT_GONE
        self._streaming = False  # stream headers sent: an interruption must end it with an error event
        self._client_left = False
        self._interrupted = False  # the gateway is stopping: the client gets a 503 or an error event
        self._writer: BodyWriter | None = None
        self._exchange = ExchangeCancel()  # the exchange runs in the request's own task
        self._trace: Trace | None = None  # with tracing on: the trace it runs in
        self._rec: ExchangeRecord | None = None  # a sampled request's spans in the making
        self._usage: dict[str, Any] | None = None
        self._result: StreamResult | None = None  # what the stream relay saw
        self._finish: str | None = None  # a whole response's finish reason (sampled requests only)
        self._handoff: Handoff | None = None  # while a stream that may move is waited for or relayed
        self._sending = False  # waiting for its backend's response head: a move sends it elsewhere whole
        self._resent_from: str | None = None  # the backend it was first sent to, once sent whole to another
        self._rid: str | None = None  # the id SGLang knows it by (`rid`), once encoded
        self._moved_from: str | None = None  # the backend its stream started on, once another went on with it
        self._given = 0  # output tokens earlier backends gave it, in the prompt of the backend that went on
        # Whether its response teaches the policy: unmoved, or moved only by its handover (all but its first
        # token decoded where it went on). Moved mid-answer (a switch's stray, a resume), its life spans two.
        self._teaches = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        telemetry = self._rt.telemetry
        if telemetry is not None and telemetry.tracing is not None:
            trace = self._trace = telemetry.trace(scope["headers"])
            if trace is not None and trace.sampled:
                job = self._job
                self._rec = telemetry.record(trace, job.request_id, job.path, self._model, self._tenant, job.tier, job.arrived_at)
        turn = self._rt.pacer.turn()
        if turn is not None:
            await turn
        task = asyncio.current_task()
        assert task is not None, "a response runs in a task"
        writer = self._writer = body_writer(scope, send)
        self._rt.requests.add(self)
        stop_watching = watch_client(writer, receive, self._client_gone)  # at once if it already left
        self._exchange.running(task)
        try:
            await self._serve(send)
        except asyncio.CancelledError:
            if not self._exchange.absorb(task):  # not only the client leaving or the shutdown
                raise
        finally:
            self._exchange.running(None)
            stop_watching()
            self._rt.requests.discard(self)
        if self._interrupted and not self._client_left:
            await self._end_interrupted(send)

    def _client_gone(self) -> None:
        self._status = CLIENT_GONE  # even after a 200 header: the client did not get it all
        self._client_left = True
        self._exchange.cancel()

    def interrupt(self) -> None:
        """The gateway is stopping: end the exchange now (the client is told, unless it has left)."""
        self._interrupted = self._exchange.cancel()

    async def _end_interrupted(self, send: Send) -> None:
        """The gateway stopped before the response ended: say so rather than cut the connection."""
        err = OpenAIError(503, "the gateway is shutting down", code="shutting_down", type="server_error")
        if self._streaming:
            await send({"type": "http.response.body", "body": self._job.dialect.stream_error(err), "more_body": False})
        elif self._status == CLIENT_GONE:  # nothing sent yet
            self._status = "503"
            await self._send_error(send, err)

    @property
    def routed_to(self) -> str | None:
        """The backend holding this request's slot; None before routing."""
        return None if self._slot is None else self._slot.backend.name

    @property
    def _backend(self) -> Backend:
        assert self._slot is not None, "used before the request was routed"
        return self._slot.backend

    async def _serve(self, send: Send) -> None:
        rt, job = self._rt, self._job
        resp: WireResponse | None = None
        try:
            try:
                if self._client_left:  # before the exchange began: counted, nothing sent
                    return
                self._slot = self._admit()
                if job.stream and self._goes_on_elsewhere():
                    # Movable from its routing on: a switch while its backend prefills (a burst's first
                    # requests, on the mode the rest turned from) moves it at its first token.
                    self._handoff = Handoff()
                resp = await self._dispatch()
            except OpenAIError as err:
                self._status = str(err.status)
                await self._send_error(send, err)
                return
            if resp.status != 200:
                await self._relay_error(resp, send)
                return
            if job.on_accepted is not None:
                job.on_accepted(self._backend.name)
            if job.stream:
                await self._relay_stream(resp, send)
            else:
                await self._relay_body(resp, send)
        finally:
            if resp is not None:
                resp.close()  # closing mid-response is what makes SGLang abort the request
            name = UNROUTED
            if self._slot is not None:
                self._slot.release()
                response_ended(rt)
                name = self._slot.backend.name
                rt.metrics.duration.labels(name).observe(time.monotonic() - job.arrived_at)
            rt.metrics.requests.labels(name, job.endpoint, self._status).inc()
            rt.metrics.tier_requests.labels(job.tier, self._status).inc()
            if job.tenant is not None:
                rt.metrics.tenant_requests.labels(job.tenant.name, self._status).inc()
            telemetry = rt.telemetry
            if telemetry is not None and (telemetry.access_log is not None or self._rec is not None):
                outcome = self._outcome(resp)
                if telemetry.access_log is not None:
                    telemetry.log(outcome, job.request_id, self._trace, self._tenant, job.path, self._model, job.tier, job.arrived_at)
                if self._rec is not None:
                    self._rec.finish(outcome)

    @property
    def _model(self) -> str | None:
        model = self._job.body.get("model")
        return model if isinstance(model, str) else None

    @property
    def _tenant(self) -> str | None:
        return None if self._job.tenant is None else self._job.tenant.name

    def _admit(self) -> Slot:
        rec = self._rec
        if rec is None:
            return admit(self._rt, self._job)
        rec.admitting()
        try:
            return admit(self._rt, self._job)
        finally:
            rec.admitted()

    def _outcome(self, resp: WireResponse | None) -> Outcome:
        """How the exchange ended, for its record."""
        job, slot, result = self._job, self._slot, self._result
        status = int(self._status)
        if slot is None:
            return Outcome(status, client_gone=self._client_left)
        decision, backend, usage = job.decision, slot.backend, self._usage
        predicted = None
        if self._rec is not None and decision is not None and job.decided_on is not None:
            predicted = self._rt.policy.predicted_tpot(job.decided_on, decision.backend)
        finish = result.finish_reason if result is not None else self._finish
        return Outcome(
            status,
            backend.name,
            backend.group,
            backend.speculative,
            decision.reason if decision is not None else None,
            decision is not None and decision.reason == FAILOVER,
            predicted,
            resp.status if resp is not None else None,
            usage,
            result.first_token_at if result is not None else None,
            result.token_chunks if result is not None else 0,
            finish,
            result.error_kind if result is not None else None,
            self._client_left,
            self._moved_from or self._resent_from,
        )

    def _encode(self, backend: Backend) -> bytes:
        job = self._job
        body = job.dialect.upstream_body(
            job.body,
            served_model=backend.served_model_name,
            stream=job.stream,
            client_wants_usage=job.client_wants_usage,
            request_id=job.request_id,
        )
        if job.prepare is not None:
            job.prepare(body, backend.name)
        rid = body.get("rid")
        self._rid = rid if isinstance(rid, str) else None
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # parsed fine, but e.g. nested deeper than orjson's 255 levels
            raise OpenAIError(400, f"request body cannot be forwarded: {exc}", code="invalid_request") from exc

    async def _dispatch(self) -> WireResponse:
        """Send upstream; a connection failure before any byte is failed over once, where the policy says."""
        rt, job = self._rt, self._job
        rt.metrics.overhead.observe(time.monotonic() - job.arrived_at)
        slot = self._slot
        assert slot is not None, "dispatched before the request was routed"
        moved = False
        while True:
            backend = self._backend
            try:
                resp = await self._send(backend)
                if resp is None:
                    await self._resend(backend.name)
                    continue
                rt.health.report_success(backend.name)
                return resp
            except ConnectFailed as exc:
                rt.metrics.upstream_errors.labels(backend.name, "connect").inc()
                await rt.health.confirm_unreachable(backend.name, type(exc).__name__)
                if moved or not fail_over(rt, job, slot, backend.name):
                    raise OpenAIError(
                        502, f"backend {backend.name} is unreachable", code="upstream_unreachable", type="server_error"
                    ) from exc
                moved = True
            except TimeoutError as exc:
                rt.metrics.upstream_errors.labels(backend.name, "first_byte_timeout").inc()
                rt.health.report_timeout(backend.name, "first-byte timeout")
                waited = f"backend {backend.name} sent nothing within {rt.settings.timeouts.first_byte:g} s"
                raise OpenAIError(504, waited, code="upstream_timeout", type="server_error") from exc
            except BadResponse as exc:  # the backend answered with something not HTTP
                rt.metrics.upstream_errors.labels(backend.name, "bad_response").inc()
                raise OpenAIError(
                    502, f"backend {backend.name} sent an invalid response", code="upstream_bad_response", type="server_error"
                ) from exc

    async def _send(self, backend: Backend) -> WireResponse | None:
        """`_post` the request; None when a move came before the response head (`move`): it goes elsewhere whole."""
        self._sending = self._handoff is not None
        try:
            return await self._post(backend)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None, "a response runs in a task"
            if not self._exchange.take_resend(task):
                raise
            return None
        finally:
            self._sending = False

    async def _resend(self, source: str) -> None:
        """The policy moved the request while `source` had not begun its response: its slot goes to the move's
        target and `source` is told to drop it, before the request is sent there whole. A closed connection
        alone would leave it running: before a stream's first chunk, SGLang looks for a client that left only
        every few seconds."""
        rt, job, slot, handoff = self._rt, self._job, self._slot, self._handoff
        assert slot is not None and handoff is not None and handoff.target is not None
        resend_on(rt, job, slot, handoff.target, handoff.reason)
        self._handoff = Handoff()  # movable there too, until its first token and after
        self._resent_from = self._resent_from or source
        # It teaches nothing, as a stream moved mid-answer: a move comes with a switch, whose moved and
        # resent prompts the target prefills in the first steps of this answer's window.
        self._teaches = False
        await self._abort(source)

    async def _abort(self, backend: str) -> None:
        """POST SGLang's `/abort_request` for this request's `rid` to `backend`; a failure is counted, not raised."""
        rt = self._rt
        if self._rid is None:
            return
        try:
            async with asyncio.timeout(rt.settings.timeouts.connect):
                resp = await rt.upstreams[backend].post("/abort_request", orjson.dumps({"rid": self._rid}))
            resp.close()
            if resp.status == 200:
                return
        except (WireError, TimeoutError):
            pass
        except Exception as exc:
            if local_kind(exc) is None:
                raise
        rt.metrics.upstream_errors.labels(backend, "abort").inc()

    async def _post(self, backend: Backend, body: bytes | None = None) -> WireResponse:
        """POST the request (or a continuation's `body`) upstream; a failure of the gateway's own
        resources becomes a 503 with Retry-After.

        Such a failure leaves the backend's health alone and is not failed over: every other backend
        is behind the same wall.
        """
        rt, rec, trace = self._rt, self._rec, self._trace
        headers = b""  # the trace context, with tracing on
        if rec is not None:
            headers = rec.upstream_header(backend.name)
        elif trace is not None:
            headers = trace.upstream_header(new_span_id())
        try:
            return await rt.upstreams[backend.name].post(self._job.path, body or self._encode(backend), headers)
        except Exception as exc:
            if rec is not None:
                rec.attempt_failed(type(exc).__name__)
            kind = local_kind(exc)
            if kind is None:
                raise
            rt.metrics.upstream_errors.labels(backend.name, "local_resource").inc()
            rt.metrics.local_errors.labels(kind).inc()
            log.warning("request %s not sent to %s: the gateway is out of %s", self._job.request_id, backend.name, kind)
            message = f"the gateway is out of local resources ({kind}), retry shortly"
            raise OpenAIError(503, message, code="gateway_overloaded", type="server_error", headers={"Retry-After": "1"}) from exc

    async def _read_all(self, resp: WireResponse) -> bytes:
        return await resp.read(self._rt.settings.timeouts.idle)

    async def _relay_error(self, resp: WireResponse, send: Send) -> None:
        name = self._backend.name
        try:
            payload = await self._read_all(resp)
        except (WireError, TimeoutError):
            payload = b""
        if resp.status >= 500:
            self._rt.metrics.upstream_errors.labels(name, f"http_{resp.status}").inc()
        err = self._job.dialect.upstream_error(resp.status, payload)
        self._status = str(err.status)
        await self._send_error(send, err)

    async def _relay_body(self, resp: WireResponse, send: Send) -> None:
        rt, name = self._rt, self._backend.name
        try:
            payload = await self._read_all(resp)
        except TimeoutError:
            rt.metrics.upstream_errors.labels(name, "idle_timeout").inc()
            rt.health.report_timeout(name, "response body timed out")
            await self._fail(send, 504, f"backend {name} stopped responding", "upstream_timeout")
            return
        except WireError:
            rt.metrics.upstream_errors.labels(name, "disconnected").inc()
            await self._fail(send, 502, f"backend {name} dropped the response", "disconnected")
            return
        handled_at = time.monotonic()
        try:
            decoded = orjson.loads(payload)
            usage = self._job.dialect.usage(decoded)
        except (ValueError, AttributeError, TypeError):  # orjson.JSONDecodeError is a ValueError
            rt.metrics.upstream_errors.labels(name, "malformed_body").inc()
            await self._fail(send, 502, f"backend {name} sent a malformed body", "malformed_body")
            return
        prompt_tokens, cached_tokens = self._count_usage(name, usage)
        tokens = int((usage or {}).get("completion_tokens") or 0)
        assert self._slot is not None
        if tokens >= 1 and self._slot.weight == 1:  # no chunk times: what it teaches is its life and usage
            rt.learn(Completion(name, tokens, handled_at - self._job.arrived_at, 0.0, 0.0, 0.0, 0, prompt_tokens, cached_tokens))
        rec = self._rec
        if rec is not None:
            self._finish = _finish_reason(decoded)
        payload = echo_json(payload, self._job.tier) if self._job.echo_tier else payload
        headers = _headers(self._job, self._slot, b"application/json", [(b"content-length", str(len(payload)).encode())])
        if rec is not None:
            rec.responding()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        rt.metrics.overhead.observe(time.monotonic() - handled_at)
        await send({"type": "http.response.body", "body": payload, "more_body": False})
        self._status = "200"

    async def _relay_stream(self, resp: WireResponse, send: Send) -> None:
        rt, job = self._rt, self._job
        slot = self._slot
        assert slot is not None
        backend = slot.backend

        def on_first(now: float) -> None:
            rt.metrics.ttft.labels(backend.name).observe(now - job.arrived_at)
            rt.metrics.tier_ttft.labels(job.tier).observe(now - job.arrived_at)

        if self._rec is not None:
            self._rec.responding()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _headers(
                    job,
                    slot,
                    job.dialect.stream_content_type,
                    [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")],
                ),
            }
        )
        self._status = "200"
        self._streaming = True
        if slot.weight == 1:  # a batch's chunks interleave several sequences: no pace of one
            slot.on_progress = rt.progress
        # A stream another backend could go on with keeps its token events: the text it goes on from when
        # the policy moves it or its backend drops it.
        keep = [] if self._continues_elsewhere() else None
        result = await self._relay(resp, send, on_first, keep)
        first, chunks = result, result.token_chunks
        while keep and (target := await self._goes_on(result)) is not None:
            if result.handed_off:  # else the tail is the error event, which the client is spared
                await send({"type": "http.response.body", "body": result.tail, "more_body": True})
            resp.close()  # SGLang aborts the request where it stands
            if self._rec is not None:
                self._rec.handed_on(result.error_kind)
            source = slot.backend.name
            reason = self._move_reason(result, target)
            moved = await self._continue(target, kept_text(keep), reason)
            if moved is None:  # a drop ends as it would have; a move, as one nobody took up
                if result.handed_off:
                    result = StreamResult(error_kind="move_failed", tail=job.dialect.stream_error(_MOVE_FAILED))
                break
            if not result.handed_off:
                assert result.error_kind is not None
                rt.metrics.upstream_errors.labels(source, result.error_kind).inc()
            resp, fix = moved
            self._teaches = self._moved_from is None and reason == "handover"
            self._moved_from = self._moved_from or source
            try:
                result = await self._relay(resp, send, None, keep, fix)
            finally:
                resp.close()  # the first response is closed where it was sent, a continuation here
            chunks += result.token_chunks
        last = result  # what the backend that ended it relayed
        if self._moved_from is not None:  # one stream for the client: its first token, every chunk, the last backend's end
            result = replace(result, first_token_at=first.first_token_at, token_chunks=chunks)
        self._result = result
        backend = slot.backend
        await send({"type": "http.response.body", "body": result.tail, "more_body": False})
        if result.error_kind is not None:
            rt.metrics.upstream_errors.labels(backend.name, result.error_kind).inc()
            if result.error_kind in ("idle_timeout",):
                rt.health.report_timeout(backend.name, "stream went silent")
            return
        prompt_tokens, cached_tokens = self._count_usage(backend.name, result.usage)
        tokens = int((result.usage or {}).get("completion_tokens") or 0)
        # A batch's chunks interleave several sequences: its pace says nothing about one sequence's. A
        # handed-over stream teaches what its last backend did (its decode window restarted there).
        window = slot.decode_window()
        if slot.weight > 1 or window is None or last.first_token_at is None or not self._teaches:
            return
        moved = self._moved_from is not None
        given = self._given if moved else 0
        if tokens - given < 2:
            return
        if not moved:
            rt.metrics.tier_tpot.labels(job.tier).observe(window.seconds / (tokens - 1))
        rt.learn(
            Completion(
                backend=backend.name,
                output_tokens=tokens,
                ttft=last.first_token_at - job.arrived_at,
                decode_seconds=window.seconds,
                mean_inflight=window.mean_inflight,
                mean_group_inflight=window.mean_group_inflight,
                token_chunks=last.token_chunks,
                prompt_tokens=0 if moved else prompt_tokens,
                cached_tokens=0 if moved else cached_tokens,
                given=given,
                group_prompt_tokens=window.group_prompt_tokens,
            )
        )

    async def _relay(
        self,
        resp: WireResponse,
        send: Send,
        on_first: Callable[[float], None] | None,
        keep: list[bytes] | None,
        fix: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> StreamResult:
        """Relay one upstream stream of the response (a continuation: `fix` its usage, no TTFT); with
        `keep`, its token events are kept, and where the policy moves streams it can be handed off."""
        rt, job, slot = self._rt, self._job, self._slot
        assert slot is not None
        gaps = GapBuffer(rt.metrics.itl.labels(slot.backend.name))  # ITL, added to the histogram once per stream
        if on_first is None:  # a continuation: the first relay's was made at routing (`_goes_on_elsewhere`)
            self._handoff = Handoff() if keep is not None and rt.policy.move_running else None
        decision = job.decision
        handoff = self._handoff
        if on_first is not None and handoff is not None and handoff.target is None and decision is not None and decision.then is not None and self._resent_from is None:
            handoff.request(decision.then)  # a handover: the first token here, the rest there
        rt.pacer.streams += 1
        try:
            return await job.dialect.relay(
                resp,
                send,
                strip_usage=not job.client_wants_usage,
                idle_timeout=rt.settings.timeouts.idle,
                on_first=on_first if on_first is not None else _nothing,
                on_token=slot.mark_token if slot.lease is None else slot.lease.metering(slot.mark_token),
                on_gap=gaps.observe if slot.weight == 1 else _nothing,  # a batch's events interleave sequences
                writer=self._writer,
                **({"annotate": stream_echo(job.tier)} if job.echo_tier else {}),
                **({"keep": keep, "handoff": self._handoff} if keep is not None else {}),
                **({"skip_role": True, "usage_fix": fix} if fix is not None else {}),
            )
        finally:
            rt.pacer.streams -= 1
            gaps.flush()
            if self._handoff is not None and self._handoff.target is None:
                self._handoff = None  # ended on its own: nothing to move any more

    def _move_reason(self, result: StreamResult, target: str) -> str:
        """Why a stream goes on on `target` (the label of its count): its decision's handover after the first
        token, a move the policy made ("switch" after a routing, "drain" while none came), or its backend
        dropped it ("resume")."""
        if not result.handed_off:
            return "resume"
        decision = self._job.decision
        if self._moved_from is None and decision is not None and decision.then == target:
            return "handover"
        return self._handoff.reason if self._handoff is not None else "switch"

    async def _goes_on(self, result: StreamResult) -> str | None:
        """The backend a stream that had token events goes on on: the one it was handed off to, else,
        when its backend dropped or stalled it, where the policy sends it now (the same backend
        when it has nothing else); None: it ended."""
        rt, job, slot = self._rt, self._job, self._slot
        assert slot is not None
        if result.handed_off:
            assert self._handoff is not None and self._handoff.target is not None
            return self._handoff.target
        kind, name = result.error_kind, slot.backend.name
        if kind not in _RESUMABLE:
            return None
        if kind == "idle_timeout":
            rt.health.report_timeout(name, "stream went silent")
        else:
            await rt.health.confirm_unreachable(name, f"stream {kind}")
        return resume_on(rt, job, name) or name

    def _continues_elsewhere(self) -> bool:
        """Whether another backend could go on with this stream: one sequence, not forced to its backend, in a
        dialect that continues an answer."""
        job, slot = self._job, self._slot
        return slot is not None and slot.weight == 1 and job.forced is None and job.dialect.continues(job.body)

    def _goes_on_elsewhere(self) -> bool:
        """Whether the policy may move this stream: it could go on elsewhere, and the policy moves streams."""
        return self._rt.policy.move_running and self._continues_elsewhere()

    def running(self, key: str) -> Running | None:
        """This response as the policy sees a running request, while its stream can be moved."""
        slot, handoff, prompt = self._slot, self._handoff, self._job.prompt
        if slot is None or handoff is None or handoff.target is not None or slot.released:
            return None
        if prompt is None:
            return Running(key, slot.backend.name, slot.chunks, slot.max_tokens, 0.0, given=self._given)
        return Running(key, slot.backend.name, slot.chunks, slot.max_tokens, prompt.tokens, prompt.cached, self._given)

    def move(self, target: str, reason: str = "switch") -> None:
        """End the stream on its backend after its next token event and continue it on `target`, or, while its
        backend has not begun the response, send it to `target` whole now (`reason`: "switch" or "drain",
        which labels its count)."""
        if self._handoff is not None:
            self._handoff.request(target, reason)
            if self._sending:
                self._exchange.resend()

    async def _continue(
        self, target: str, text: str | None, reason: str
    ) -> tuple[WireResponse, Callable[[dict[str, Any]], dict[str, Any]]] | None:
        """Have `target` go on with the answer, which has `text` so far, else, for a move the policy made
        (`reason` "switch" or "handover", which labels its count, as "resume" does a drop's), the live
        backend it left; the continuation's response (status 200) and its usage fix. None: none goes on with it."""
        rt, job, slot = self._rt, self._job, self._slot
        assert slot is not None
        if text is None:
            return None
        source = slot.backend.name
        for name in dict.fromkeys((target, source) if reason != "resume" else (target,)):
            backend = rt.pool[name]
            if not backend.available:
                continue
            plan = await continuation(job, backend, rt.upstreams[name], text)
            if plan is None:
                rt.metrics.upstream_errors.labels(name, "tokenize").inc()
                continue
            limit = None if job.max_tokens is None else max(job.max_tokens - plan.given, 1)
            continue_on(rt, job, slot, name, limit, reason)
            try:
                resp = await self._post(backend, plan.body)
            except OpenAIError:  # the gateway's own resources, counted where they failed
                continue
            except TimeoutError:
                rt.metrics.upstream_errors.labels(name, "first_byte_timeout").inc()
                continue
            except WireError as exc:
                rt.metrics.upstream_errors.labels(name, "connect" if isinstance(exc, ConnectFailed) else "bad_response").inc()
                continue
            if resp.status == 200:
                rt.health.report_success(name)
                self._given = plan.given
                return resp, plan.usage
            resp.close()
            rt.metrics.upstream_errors.labels(name, f"http_{resp.status}").inc()
        return None

    def _count_usage(self, backend: str, usage: dict[str, Any] | None) -> tuple[int, int]:
        """Count a response's usage (and charge its tenant); its (prompt tokens, cached prompt tokens),
        (0, 0) without usage."""
        self._usage = usage
        if not usage:
            return 0, 0
        rt, tenant = self._rt, self._job.tenant
        completion_tokens = int(usage.get("completion_tokens") or 0)
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rt.pool.record_output(backend, completion_tokens)
        rt.metrics.output_tokens.labels(backend).inc(completion_tokens)
        rt.metrics.prompt_tokens.labels(backend).inc(prompt_tokens)
        if tenant is not None:
            rt.metrics.tenant_tokens.labels(tenant.name, "prompt").inc(prompt_tokens)
            rt.metrics.tenant_tokens.labels(tenant.name, "completion").inc(completion_tokens)
            if self._slot is not None and self._slot.lease is not None:
                self._slot.lease.settle(prompt_tokens, completion_tokens)
        details = usage.get("prompt_tokens_details")
        reported = details.get("cached_tokens") if isinstance(details, dict) else None
        cached = reported if isinstance(reported, int) and reported > 0 else 0
        rt.metrics.prefix_hit_tokens.labels(backend).inc(cached)
        key, prompt = self._job.prefix, self._job.prompt
        if key is None or prompt is None or self._slot is None or self._moved_from is not None:  # a moved answer's prompt grew
            return prompt_tokens, cached
        index = self._slot.backend.index
        predicted = prompt.cached.get(backend, 0.0)
        rt.metrics.prefix_predicted_tokens.labels(backend).inc(predicted)
        rt.pool.record_prompt(backend, prompt_tokens, cached, predicted)
        rt.prefix_estimate.learn(index, key.size, prompt_tokens, predicted, reported if isinstance(reported, int) else None)
        return prompt_tokens, cached

    async def _fail(self, send: Send, status: int, message: str, code: str) -> None:
        self._status = str(status)
        await self._send_error(send, OpenAIError(status, message, code=code, type="server_error"))

    async def _send_error(self, send: Send, err: OpenAIError) -> None:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", self._job.request_id.encode()), tier_header(self._job.tier)]
        headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        if self._slot is not None:
            headers.append((b"x-specgate-backend", self._slot.backend.name.encode()))
        body = err.body()
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _finish_reason(body: Any) -> str | None:
    """The first choice's finish reason of a whole OpenAI response body (None: it has none)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return reason if isinstance(reason, str) else None
