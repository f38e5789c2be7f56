"""The ASGI response that carries one generation request from the engine to the client.

Like SGLang, a stream's HTTP headers are held back until its first output chunk exists, so the time
to headers is the TTFT. A client that disconnects, at any point (before headers, mid-stream, or while
a non-streaming request waits), aborts its request in the engine at once: a watcher task reads the
ASGI `receive` channel for `http.disconnect` for the whole life of the response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from backends.sim.engine import Engine
from backends.sim.faults import StreamFaults
from backends.sim.render import Renderer
from backends.sim.request import SimRequest

_GARBAGE_EVENT = b"data: {this is not json\n\n"
_GARBAGE_BODY = b"{this is not json"


class InjectedDrop(Exception):
    """Raised inside a response to make the server close the connection mid-body (`drop_mid_stream`)."""


def cached_details(cached_tokens: int, cache_report: bool) -> dict[str, int] | None:
    """SGLang's `prompt_tokens_details`: only with `--enable-cache-report`, and then always, 0 included
    (`UsageProcessor.calculate_response_usage`)."""
    return {"cached_tokens": cached_tokens} if cache_report else None


def usage_of(req: SimRequest, num_draft_tokens: int | None, *, cache_report: bool) -> dict[str, Any]:
    """SGLang's usage object; with `num_draft_tokens` (spec details requested) the speculation figures too."""
    usage: dict[str, Any] = {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + req.produced,
        "completion_tokens": req.produced,
        "prompt_tokens_details": cached_details(req.cached_tokens, cache_report),
        "reasoning_tokens": 0,
    }
    if num_draft_tokens is not None:
        accept = (req.produced - 1) / req.verify_steps if req.verify_steps else 1.0
        usage["spec_accept_length"] = accept
        usage["spec_accept_rate"] = (accept - 1.0) / (num_draft_tokens - 1)
        usage["spec_verify_ct"] = req.verify_steps
    return usage


class GenerationResponse(Response):
    """Streams (or, without `stream`, returns whole) the output of one engine request.

    A `Response` so that FastAPI passes it through; it writes its own status and headers.
    """

    def __init__(
        self,
        engine: Engine,
        req: SimRequest,
        renderer: Renderer,
        *,
        include_usage: bool,
        spec_details: int | None,
        cache_report: bool,
        faults: StreamFaults,
    ) -> None:
        self.engine = engine
        self.req = req
        self.renderer = renderer
        self.include_usage = include_usage
        self.spec_details = spec_details
        self.cache_report = cache_report
        self.faults = faults
        self.client_gone = False
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            if self.req.is_streaming:
                await self._stream(send)
            else:
                await self._complete(send)
        except OSError:
            pass  # the client went away while we were writing; the abort below frees the request
        finally:
            watcher.cancel()
            self.engine.abort(self.req)
        if self.background is not None:
            await self.background()

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
                self.engine.abort(self.req)
                self.req.event.set()
                return

    def _usage(self) -> dict[str, Any]:
        return usage_of(self.req, self.spec_details, cache_report=self.cache_report)

    def _final_text(self, text: str, chars_before: int) -> str:
        limit = self.req.text_limit
        return text if limit is None else text[: max(limit - chars_before, 0)]

    async def _stream(self, send: Send) -> None:
        req, renderer, faults = self.req, self.renderer, self.faults
        text_of = self.engine.text.text
        sent = sent_chars = chunks = 0
        started = False
        while True:
            await req.event.wait()
            req.event.clear()
            if self.client_gone:
                return
            new = req.produced - sent
            if new == 0 and not req.done:
                continue
            text = text_of(req.text_start, sent, new) if new else ""
            sent = req.produced
            if req.done:
                text = self._final_text(text, sent_chars)
                body = renderer.ending(text, req.finish_reason or "abort", req.matched_stop)
                if self.include_usage:
                    body += renderer.usage(self._usage())
                body += renderer.done
            else:
                body = renderer.content(text)
            sent_chars += len(text)
            if not started:
                headers = [(b"content-type", renderer.stream_content_type)]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                body = renderer.opening() + body
                started = True
            if faults.drop_after == chunks:
                raise InjectedDrop(f"drop_mid_stream fault after {chunks} chunks")
            if faults.truncate_after == chunks:
                await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": False})
                return
            if faults.garbage_after == chunks:
                body = _GARBAGE_EVENT + body
            chunks += 1
            await send({"type": "http.response.body", "body": body, "more_body": not req.done})
            if req.done:
                return

    async def _complete(self, send: Send) -> None:
        req = self.req
        while not req.done:
            await req.event.wait()
            req.event.clear()
            if self.client_gone:
                return
        if self.client_gone:
            return
        text = self._final_text(self.engine.text.text(req.text_start, 0, req.produced), 0)
        body = self.renderer.complete(text, req.finish_reason or "abort", req.matched_stop, self._usage())
        faults = self.faults
        if faults.garbage_after is not None:
            body = _GARBAGE_BODY
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if faults.drop_after is not None or faults.stall_body:
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            if faults.drop_after is not None:
                raise InjectedDrop("drop_mid_stream fault: a non-streamed body cut in half")
            while not self.client_gone:  # stall_body: the watcher wakes this when the client leaves
                await req.event.wait()
                req.event.clear()
            return
        await send({"type": "http.response.body", "body": body, "more_body": False})
