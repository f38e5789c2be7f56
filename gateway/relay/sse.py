"""The SSE relay: OpenAI-format upstream events to the client, one by one, as the exact bytes SGLang sent.

The relay still sees what each event carries: the usage chunk it may have to strip, an in-stream
error, garbage that must not reach the client, and which events carry tokens (TTFT/ITL). A decode
chunk is recognised from its bytes (`tokens_by_bytes`: a JSON object whose `content`,
`reasoning_content` or `text` string, or `tool_calls` list, is non-empty, naming no `error` and no
usage but SGLang's closing null one); anything else is decoded whole. What to do with each event is
decided in one place (`EventTriage.take`), fed by one of two drivers: `_CallbackRelay` relays in
the upstream connection's read callback and writes with the server's `BodyWriter` (with the C
extension, `_sse.TokenSink` takes reads of whole token chunks without a Python frame), and
`_relay_awaiting_send` reads in the request's task and awaits `send` per event (any other server).
Why the byte check and the callback relay: docs/benchmarks/relay-cost.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import Send

from gateway.edge.body_writer import BodyWriter
from gateway.errors import OpenAIError
from gateway.relay import ChunkReader, Handoff, StreamResult
from gateway.relay.idle_watch import IdleWatch
from gateway.upstream.errors import WireError
from gateway.upstream.http11 import MAX_FRAME, WireResponse

try:
    from gateway.relay._sse import TokenSink
except ImportError:  # built without a C compiler: every read is taken in Python
    TokenSink = None

DONE = b"data: [DONE]\n\n"
_SEPARATOR = b"\n\n"
# A key followed by the first byte of a non-empty value: conclusive evidence of generated tokens.
# Inside a JSON string every quote is escaped, so these can only match keys.
_TOKEN_KEYS = (b'"content":"', b'"reasoning_content":"', b'"text":"')
_TOOL_CALLS = b'"tool_calls":['
_NO_USAGE = b',"usage":null}\n\n'


def _carries_tokens(chunk: dict[str, Any]) -> bool:
    """True when a chat or completions chunk has generated content (not role/finish-only)."""
    choices = chunk.get("choices")
    if not choices:
        return False
    choice = choices[0]
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(
        delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
    )


def _opens_answer(choice: dict[str, Any]) -> bool:
    """Whether a chat chunk's choice only opens the answer: the assistant's role, no text, no finish."""
    delta = choice.get("delta")
    return isinstance(delta, dict) and "role" in delta and not delta.get("content") and not choice.get("finish_reason")


def read_openai_chunk(chunk: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """A chat/completions chunk's usage (None if it has none) and whether it carries generated tokens."""
    return chunk.get("usage"), _carries_tokens(chunk)


def tokens_by_bytes(event: bytes) -> bool:
    """True when the SSE `event` is surely a plain token chunk (see the module docstring); False: decode it.

    Looks at the event as SGLang frames it (`data: {...}` and the blank line), so the payload is
    never copied out for the check.
    """
    if not event.startswith(b"data: {") or event.find(b'"error"') >= 0:
        return False
    # SGLang ends every chunk with a null usage: the last key of the object. Any other usage is decoded.
    if not event.endswith(_NO_USAGE) and (not event.endswith(b"}\n\n") or event.find(b'"usage":') >= 0):
        return False
    for key in _TOKEN_KEYS:
        at = event.find(key)
        if at >= 0 and event[at + len(key)] != 0x22:  # not the closing quote of ""
            return True
    at = event.find(_TOOL_CALLS)
    return at >= 0 and event[at + len(_TOOL_CALLS)] != 0x5D  # not the "]" of []


class EventTriage:
    """One stream's events, one at a time: what to send for each, and what the stream told so far."""

    __slots__ = (
        "result", "ended", "failed", "_strip_usage", "on_first", "on_token", "on_gap", "_read", "by_bytes", "annotate", "keep",
        "handoff", "skip_role", "usage_fix",
    )

    def __init__(
        self,
        strip_usage: bool,
        on_first: Callable[[float], None],
        on_token: Callable[[float], None],
        on_gap: Callable[[float], None],
        read: ChunkReader,
        annotate: Callable[[bytes], bytes] | None,
        keep: list[bytes] | None = None,
        handoff: Handoff | None = None,
        skip_role: bool = False,
        usage_fix: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.result = StreamResult()
        self.keep = keep  # each token event's bytes, as they came (a movable stream's text)
        self.handoff = handoff
        # A continuation (another backend going on with an answer the client is reading): its opening
        # role chunk is not the client's to see again, and its usage counts the given text as prompt.
        self.skip_role = skip_role
        self.usage_fix = usage_fix
        self.ended = False  # [DONE] came, or the stream failed
        self.failed = False  # ended without [DONE]: the client gets an error event (result.error_kind)
        self._strip_usage = strip_usage
        self.on_first = on_first
        self.on_token = on_token
        self.on_gap = on_gap
        self._read = read
        # The byte-level check knows OpenAI's chunks only; other formats are always decoded.
        self.by_bytes = read is read_openai_chunk
        self.annotate = annotate

    def fail(self, kind: str) -> None:
        """End the stream without [DONE]."""
        self.result.error_kind = kind
        self.ended = self.failed = True

    def take(self, event: bytes) -> bytes | None:
        """What to send the client for one whole event (None: nothing)."""
        result = self.result
        if self.by_bytes and tokens_by_bytes(event):
            tokens = True
        elif not event.startswith(b"data:"):  # comments and other fields pass as they are
            return event
        elif (payload := event[5:].strip()) == b"[DONE]":
            self.ended = True
            return event
        else:
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                self.fail("malformed_event")
                return None
            if not isinstance(chunk, dict):
                self.fail("malformed_event")
                return None
            if "error" in chunk:  # SGLang reports aborts mid-stream this way; pass it on, [DONE] follows
                result.error_kind = "stream_error"
                return event
            usage, tokens = self._read(chunk)
            if not tokens and (choices := chunk.get("choices")) and isinstance(choices, list) and isinstance(choices[0], dict):
                if self.skip_role and result.token_chunks == 0 and _opens_answer(choices[0]):
                    return None
                result.finish_reason = choices[0].get("finish_reason") or result.finish_reason
            if usage and self.usage_fix is not None:
                usage = chunk["usage"] = self.usage_fix(usage)
                event = b"data: " + orjson.dumps(chunk) + _SEPARATOR
            if usage:
                result.usage = usage
                if not chunk.get("choices") and self._strip_usage:
                    return None  # the usage chunk we asked for on the client's behalf
        if tokens:
            self.tokens(1)
            if self.keep is not None:
                self.keep.append(event)
            if self.handoff is not None and self.handoff.target is not None:
                self.ended = result.handed_off = True  # this event goes out as the tail; another backend goes on
        return event if self.annotate is None else self.annotate(event)

    def tokens(self, events: int) -> None:
        """Count `events` token-carrying events that arrived now (one read's worth)."""
        result = self.result
        now = time.monotonic()
        for _ in range(events):
            if result.first_token_at is None:
                result.first_token_at = now
                self.on_first(now)
            else:
                self.on_gap(now - result.last_token_at)  # type: ignore[operator]
            self.on_token(now)
            result.last_token_at = now
        result.token_chunks += events


async def relay_stream(
    resp: WireResponse,
    send: Send,
    *,
    strip_usage: bool,
    idle_timeout: float,
    on_first: Callable[[float], None],
    on_token: Callable[[float], None],
    on_gap: Callable[[float], None],
    read: ChunkReader = read_openai_chunk,
    annotate: Callable[[bytes], bytes] | None = None,
    writer: BodyWriter | None = None,
    keep: list[bytes] | None = None,
    handoff: Handoff | None = None,
    skip_role: bool = False,
    usage_fix: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> StreamResult:
    """Relay every event of `resp` to `send` until [DONE], an error or EOF.

    Ends the client's stream cleanly in every case: an upstream failure becomes one SSE error
    event followed by [DONE], never a hang or a silent truncation. Does not send the final empty
    body message; the caller does, with `tail` (the last event, held back so that it and the end
    of the chunked body go out in one socket write). `on_token(now)` is called for each event
    that carries generated tokens, `on_first(now)` before it for the first, `on_gap(seconds)` with
    the time since the previous one for the others (separate callables, so a caller can pass its
    bookkeeping's own methods: a call less per chunk than a closure that forwards);
    `annotate`, when given, rewrites each chunk event before it is sent (the service tier's echo).
    `read` tells an event's usage so far and whether it carries tokens (the API's chunk format).
    With a `writer` (the server's, for this request) events are relayed as they are read, in the
    upstream connection's read callback, and written with it instead of `send`. With `keep`, every
    read holding token events is appended to it as it came (`kept_text` reads the text back). With
    `handoff`, once it is requested the stream ends after its next token event (`handed_off`, that
    event the tail, no [DONE]): the caller closes the upstream and another backend goes on. A
    continuation's relay drops the chat chunk that opens its answer (`skip_role`) and reports usage
    through `usage_fix` (the result's, and the usage chunk the client gets, re-encoded).
    """
    events = EventTriage(strip_usage, on_first, on_token, on_gap, read, annotate, keep, handoff, skip_role, usage_fix)
    watch = IdleWatch(idle_timeout)
    try:
        if writer is None:
            await _relay_awaiting_send(resp, send, watch, events)
        else:
            await _CallbackRelay(resp, writer, watch, events).run()
    finally:
        watch.close()
    if events.failed:
        kind = events.result.error_kind
        events.result.tail = OpenAIError(502, f"upstream stream failed: {kind}", code=kind).sse_event() + DONE
    return events.result


async def _relay_awaiting_send(resp: WireResponse, send: Send, watch: IdleWatch, events: EventTriage) -> None:
    """Read each event in this task and await `send` for it."""
    readuntil = resp.readuntil
    loop_time = asyncio.get_running_loop().time
    while not events.ended:
        watch.reading_since = loop_time()
        try:
            event = await readuntil(_SEPARATOR)
        except asyncio.CancelledError:
            if not watch.timed_out():
                raise
            events.fail("idle_timeout")
            return
        except ValueError:  # one event larger than the read buffer: not something SGLang sends
            events.fail("malformed_event")
            return
        except (WireError, ConnectionError):
            events.fail("disconnected")
            return
        finally:
            watch.reading_since = None
        if not event.endswith(_SEPARATOR):  # EOF, possibly with half an event: the stream was cut
            events.fail("truncated")
            return
        out = events.take(event)
        if events.ended:
            events.result.tail = out or b""
            return
        if out is not None:
            await send({"type": "http.response.body", "body": out, "more_body": True})


class _CallbackRelay:
    """Relays in the upstream connection's read callback (`BodySink`); the task waits for the end.

    The task wakes only when the stream ends or the client's socket buffer fills (then upstream
    reading pauses until the client drains). An exception raised while relaying is re-raised in
    the task, as `_relay_awaiting_send` would raise it. With the C extension a `TokenSink` takes every read first
    and hands all but whole token chunks to `_take`.
    """

    __slots__ = ("_resp", "_writer", "_watch", "_events", "_sink", "_rest", "_wakeup", "_error", "_stopped", "_loop_time")

    def __init__(self, resp: WireResponse, writer: BodyWriter, watch: IdleWatch, events: EventTriage) -> None:
        self._resp = resp
        self._writer = writer
        self._watch = watch
        self._events = events
        self._rest = b""  # the start of an event whose end has not arrived
        loop = asyncio.get_running_loop()
        self._loop_time = loop.time
        self._wakeup: asyncio.Future[None] = loop.create_future()
        self._error: Exception | None = None
        self._stopped = False
        # Only OpenAI's chunks are known byte by byte, and annotated events are rewritten one by one.
        self._sink = None
        if events.handoff is not None:
            events.handoff.poke = self._no_fast_path
        if TokenSink is not None and events.by_bytes and events.annotate is None:
            self._sink = TokenSink(
                slow=self._take, fail=self._fail, pause=self._pause, result=events.result,
                on_first=events.on_first, on_gap=events.on_gap, on_token=events.on_token,
                transport=writer.transport, flow=writer.flow, watch=watch, loop_time=loop.time, keep=events.keep,
            )

    @property
    def data(self) -> Callable[[bytes], None]:
        """What takes each read of the body (`BodySink`)."""
        return self._take if self._sink is None else self._sink.data

    async def run(self) -> None:
        """Relay until the stream ends; returns with `events` ended, or raises."""
        watch, events = self._watch, self._events
        watch.reading_since = self._loop_time()
        self._resp.divert(self)
        try:
            while not self._stopped:
                await self._wakeup
                if self._stopped:
                    break
                self._wakeup = asyncio.get_running_loop().create_future()
                await self._writer.drain()
                watch.reading_since = self._loop_time()
                self._resp.resume()
        except asyncio.CancelledError:
            if not watch.timed_out():
                raise
            events.fail("idle_timeout")
        finally:
            self._stopped = True
            if self._sink is not None:
                self._sink.close()  # it holds this relay's methods: no cycle left for the collector
            if events.handoff is not None:
                events.handoff.poke = None  # likewise
        if self._error is not None:
            raise self._error

    def _take(self, data: bytes) -> None:
        if self._stopped:
            return
        events, write = self._events, self._writer.write
        if self._rest:
            data = self._rest + data
        start = 0
        paused: bool | None = None  # as the last write left the client's buffer; None: nothing written
        try:
            while (at := data.find(_SEPARATOR, start)) >= 0:
                end = at + 2
                out = events.take(data[start:end])
                start = end
                if events.ended:
                    events.result.tail = out or b""
                    self._stop()
                    return
                if out is not None:
                    paused = write(out)
        except Exception as exc:  # noqa: BLE001 - raised in the task, not in the socket's callback
            self._fail(exc)
            return
        self._rest = data[start:]
        if self._sink is not None:
            self._sink.whole = not self._rest and (events.handoff is None or events.handoff.target is None)
        if len(self._rest) > MAX_FRAME:  # one event larger than the read buffer: not something SGLang sends
            events.fail("malformed_event")
            self._stop()
        elif self._writer.paused if paused is None else paused:
            self._pause()
        else:
            self._watch.reading_since = self._loop_time()

    def _no_fast_path(self) -> None:
        """A handoff was requested: every later read goes through `_take`, which ends at a token event."""
        if self._sink is not None:
            self._sink.whole = False

    def _pause(self) -> None:
        """The client's buffer is full: read no more upstream until it drains."""
        self._resp.pause()
        self._watch.reading_since = None  # a slow client is no upstream silence
        self._wake()

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        self._stop()

    def end(self, exc: BaseException | None) -> None:
        if self._stopped:
            return
        # At the body's end without [DONE], with or without half an event: the stream was cut.
        self._events.fail("truncated" if exc is None else "disconnected")
        self._stop()

    def _stop(self) -> None:
        self._stopped = True
        if self._sink is not None:
            self._sink.whole = False  # every later read goes to `_take`, which ignores it
        self._wake()

    def _wake(self) -> None:
        if not self._wakeup.done():
            self._wakeup.set_result(None)


def kept_text(keep: list[bytes]) -> str | None:
    """The generated text of the token events `relay_stream` kept: each chunk's first choice's content
    (chat: `delta.content`; completions: `text`), in order. None when an event carried what text
    alone cannot give back (reasoning, tool calls)."""
    parts: list[str] = []
    for blob in keep:
        for event in blob.split(_SEPARATOR):
            payload = event[5:].strip() if event.startswith(b"data:") else b""
            if not payload or payload == b"[DONE]":
                continue
            chunk = orjson.loads(payload)
            choices = chunk.get("choices") if isinstance(chunk, dict) else None
            if not choices or not isinstance(choices[0], dict):
                continue
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict) and (delta.get("reasoning_content") or delta.get("tool_calls")):
                return None
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)
