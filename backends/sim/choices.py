"""The response of a chat request with `n` > 1: n engine requests, answered as one, as SGLang does.

SGLang runs each of the n choices as its own request in the batch (so n choices cost n slots)
and answers with one response: `choices` indexed 0..n-1, prompt tokens counted once and
completion tokens summed. Streamed, the choices' chunks interleave as their tokens come, each
carrying its `index`; one usage chunk and `[DONE]` follow the last. A client that disconnects
aborts every choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from backends.sim.chat_extras import ExtrasChatRenderer
from backends.sim.engine import Engine
from backends.sim.request import SimRequest
from backends.sim.responses import usage_of


def merged_usage(reqs: list[SimRequest], *, cache_report: bool) -> dict[str, Any]:
    """SGLang's usage of n choices of one prompt (the prompt and its cached tokens counted once)."""
    usages = [usage_of(r, None, cache_report=cache_report) for r in reqs]
    prompt = usages[0]["prompt_tokens"]
    completion = sum(u["completion_tokens"] for u in usages)
    return {**usages[0], "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ChoicesResponse(Response):
    """Streams (or returns whole) the n choices of one chat request."""

    def __init__(
        self,
        engine: Engine,
        reqs: list[SimRequest],
        renderers: list[ExtrasChatRenderer],
        *,
        stream: bool,
        include_usage: bool,
        cache_report: bool,
    ) -> None:
        self.engine, self.reqs, self.renderers = engine, reqs, renderers
        self.stream, self.include_usage, self.cache_report = stream, include_usage, cache_report
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._stream(send) if self.stream else self._complete(send))
        gone = asyncio.ensure_future(self._watch(receive))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            work.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
            for req in self.reqs:
                self.engine.abort(req)

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    def _text(self, req: SimRequest, first: int, count: int, chars_before: int, final: bool) -> str:
        text = self.engine.text.text(req.text_start, first, count) if count else ""
        if final and req.text_limit is not None:
            text = text[: max(req.text_limit - chars_before, 0)]
        return text

    async def _chunks(self, req: SimRequest, renderer: ExtrasChatRenderer) -> AsyncIterator[bytes]:
        sent = chars = 0
        while True:
            await req.event.wait()
            req.event.clear()
            new = req.produced - sent
            if new == 0 and not req.done:
                continue
            text = self._text(req, sent, new, chars, req.done)
            sent, chars = req.produced, chars + len(text)
            if req.done:
                yield renderer.ending(text, req.finish_reason or "abort", req.matched_stop)
                return
            yield renderer.content(text)

    async def _stream(self, send: Send) -> None:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def pump(req: SimRequest, renderer: ExtrasChatRenderer) -> None:
            async for chunk in self._chunks(req, renderer):
                await queue.put(chunk)
            await queue.put(None)

        pumps = [asyncio.ensure_future(pump(r, rd)) for r, rd in zip(self.reqs, self.renderers, strict=True)]
        try:
            first = await queue.get()
            headers = [(b"content-type", ExtrasChatRenderer.stream_content_type)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            opening = b"".join(r.opening() for r in self.renderers)
            pending, chunk = len(pumps), first
            body = opening
            while True:
                if chunk is None:
                    pending -= 1
                else:
                    body += chunk
                if pending == 0:
                    break
                await send({"type": "http.response.body", "body": body, "more_body": True})
                body = b""
                chunk = await queue.get()
            if self.include_usage:
                body += self.renderers[0].usage(merged_usage(self.reqs, cache_report=self.cache_report))
            await send({"type": "http.response.body", "body": body + ExtrasChatRenderer.done, "more_body": False})
        finally:
            for task in pumps:
                task.cancel()

    async def _complete(self, send: Send) -> None:
        for req in self.reqs:
            while not req.done:
                await req.event.wait()
                req.event.clear()
        choices = [
            rd.choice(self._text(r, 0, r.produced, 0, True), r.finish_reason or "abort", r.matched_stop)
            for r, rd in zip(self.reqs, self.renderers, strict=True)
        ]
        head = self.renderers[0]
        body = orjson.dumps(
            {
                "id": head.rid,
                "object": "chat.completion",
                "created": head.created,
                "model": head.model,
                "choices": choices,
                "usage": merged_usage(self.reqs, cache_report=self.cache_report),
                "metadata": None,
            }
        )
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
