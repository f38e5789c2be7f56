"""The SSE relay against a scripted upstream: bytes pass through untouched, failures end cleanly.

Every test runs every way the relay can run: pulling events in the request's task and awaiting
`send` for each, and pushed from the upstream connection's read callback through the server's
body writer (`gateway/edge/body_writer.py`), here on a stand-in for uvicorn's request cycle; pushed
both with the per-read check in C (`gateway/relay/_sse.c`) and as a build without it runs.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import orjson
import pytest

from gateway.edge.body_writer import EXTENSION, BodyWriter, body_writer
from gateway.relay import Handoff
from gateway.relay import sse as relay
from gateway.relay.sse import DONE, relay_stream
from gateway.upstream.http11 import MAX_FRAME, Connection, WireResponse


class Flow:
    """uvicorn's flow control as the body writer sees it: paused, and drained by the test."""

    def __init__(self) -> None:
        self.write_paused = False
        self.drained = asyncio.Event()
        self.drained.set()

    async def drain(self) -> None:
        await self.drained.wait()


class Cycle:
    """What `BodyWriter` uses of uvicorn's request cycle; every body, written or sent, lands in `sent`."""

    def __init__(self, pause_after: int | None = None) -> None:
        self.sent: list[bytes] = []
        self.disconnected = False
        self.transport = self
        self.flow = Flow()
        self._pause_after = pause_after

    def write(self, data: bytes) -> None:  # the client's transport: one chunk of a chunked body
        size, _, rest = data.partition(b"\r\n")
        assert int(size, 16) == len(rest) - 2 > 0 and rest.endswith(b"\r\n")
        self.sent.append(rest[:-2])
        if self._pause_after is not None and len(self.sent) >= self._pause_after:
            self.flow.write_paused = True
            self.flow.drained.clear()

    def is_closing(self) -> bool:  # the client's transport
        return self.disconnected

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message["body"])


@pytest.fixture(params=["pull", "push", "push without C"])
def push(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "push without C":
        monkeypatch.setattr(relay, "TokenSink", None)
    return bool(request.param != "pull")


def event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(text: str, **extra: Any) -> bytes:
    return event({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}], **extra})


ROLE = event({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
FINISH = event({"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
USAGE = event({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})


async def run_relay(
    resp: WireResponse, *, push: bool, strip_usage: bool, idle: float = 5.0, cycle: Cycle | None = None,
    keep: list[bytes] | None = None, handoff: Any = None, on_token: Any = None, **continuation: Any,
) -> tuple[bytes, Any, list[float], int]:
    cycle = cycle or Cycle()
    gaps: list[float] = []
    firsts = 0

    def on_first(now: float) -> None:
        nonlocal firsts
        firsts += 1

    writer = BodyWriter(cycle) if push else None
    result = await relay_stream(
        resp, cycle.send, strip_usage=strip_usage, idle_timeout=idle, on_first=on_first, on_token=on_token or (lambda now: None),
        on_gap=gaps.append, writer=writer, keep=keep, handoff=handoff, **continuation,
    )
    resp.close()
    return b"".join(cycle.sent) + result.tail, result, gaps, firsts  # the caller sends the tail with the end


async def test_bytes_are_relayed_untouched_and_usage_is_read(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    parts = [ROLE, chunk("a"), chunk("bc d") + chunk("e"), FINISH, USAGE, DONE]
    out, result, gaps, firsts = await run_relay(push=push, resp=await upstream(parts), strip_usage=False)
    assert out == b"".join(parts)
    assert result.error_kind is None
    assert result.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert result.token_chunks == 3 and firsts == 1 and len(gaps) == 2  # role and finish chunks carry no tokens
    assert result.finish_reason == "length"  # from the finish chunk; the usage chunk after it has none


async def test_a_kept_stream_gives_back_the_text_it_carried(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    parts = [ROLE, chunk("a"), chunk(" bc \u00e9") + chunk(" d"), FINISH, USAGE, DONE]
    keep: list[bytes] = []
    out, result, _, _ = await run_relay(push=push, resp=await upstream(parts), strip_usage=False, keep=keep)
    assert out == b"".join(parts)  # keeping changes nothing the client gets
    assert relay.kept_text(keep) == "a bc \u00e9 d" and result.token_chunks == 3


async def test_a_handoff_ends_the_stream_after_a_token_event_without_done(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    texts = ["a", " b", " c", " d", " e"]
    parts = [ROLE, *[chunk(t) for t in texts], FINISH, USAGE, DONE]
    handoff, keep = Handoff(), []
    out, result, _, _ = await run_relay(
        push=push, resp=await upstream(parts), strip_usage=False, keep=keep, handoff=handoff,
        on_token=lambda now: handoff.request("other") if handoff.target is None else None,
    )
    assert result.handed_off and result.error_kind is None and not out.endswith(DONE)
    # What the client got is the stream up to a token event, and exactly what was kept.
    relayed = result.token_chunks
    assert 1 <= relayed < len(texts) + 1 and out == b"".join(parts[: 1 + relayed])
    assert relay.kept_text(keep) == "".join(texts[:relayed])


async def test_a_handoff_requested_before_the_stream_began_ends_it_at_its_first_token_event(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    # A decision's handover: the whole stream in one read, and no token event is relayed past the first.
    parts = [ROLE, chunk("a"), chunk(" b"), chunk(" c"), FINISH, USAGE, DONE]
    handoff, keep = Handoff(), []
    handoff.request("other")
    out, result, _, _ = await run_relay(push=push, resp=await upstream([b"".join(parts)]), strip_usage=False, keep=keep, handoff=handoff)
    assert result.handed_off and result.token_chunks == 1 and out == ROLE + chunk("a")
    assert relay.kept_text(keep) == "a"


async def test_a_continuation_drops_its_opening_chunk_and_reports_the_answers_usage(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    parts = [ROLE, chunk(" c"), chunk(" d"), FINISH, USAGE, DONE]

    def fix(usage: dict[str, int]) -> dict[str, int]:  # 2 of the 5 prompt tokens were the answer given back
        return {"prompt_tokens": usage["prompt_tokens"] - 2, "completion_tokens": usage["completion_tokens"] + 2,
                "total_tokens": usage["total_tokens"]}

    out, result, _, _ = await run_relay(push=push, resp=await upstream(parts), strip_usage=False, skip_role=True, usage_fix=fix)
    fixed = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert result.usage == fixed and result.token_chunks == 2
    usage_event = event({"id": "x", "choices": [], "usage": fixed})
    assert out == b"".join([chunk(" c"), chunk(" d"), FINISH, usage_event, DONE])


async def test_the_last_event_is_held_back_for_the_response_end(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    # [DONE] (or an error event and [DONE]) goes out with the chunked body's end: one write, not two.
    cycle = Cycle()
    _, result, _, _ = await run_relay(push=push, resp=await upstream([chunk("a"), FINISH, DONE]), strip_usage=True, cycle=cycle)
    assert result.tail == DONE and b"".join(cycle.sent) == chunk("a") + FINISH
    cycle = Cycle()
    _, result, _, _ = await run_relay(push=push, resp=await upstream([chunk("a")]), strip_usage=True, cycle=cycle)
    assert b"".join(cycle.sent) == chunk("a") and result.tail.endswith(DONE) and b"truncated" in result.tail


async def test_usage_chunk_is_stripped_when_the_client_did_not_ask(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    parts = [chunk("a"), FINISH, USAGE, DONE]
    out, result, _, _ = await run_relay(push=push, resp=await upstream(parts), strip_usage=True)
    assert out == chunk("a") + FINISH + DONE
    assert result.usage is not None and result.usage["completion_tokens"] == 3


async def test_event_split_across_writes_is_reassembled(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    whole = chunk("hello")
    out, result, _, _ = await run_relay(push=push, resp=await upstream([whole[:7], whole[7:20], whole[20:], DONE]), strip_usage=True)
    assert out == whole + DONE and result.token_chunks == 1


@pytest.mark.parametrize(
    ("parts", "kind"),
    [
        ([chunk("a")], "truncated"),
        ([chunk("a"), b"data: {\"choi"], "truncated"),
        ([chunk("a"), b"data: not json\n\n", chunk("b"), DONE], "malformed_event"),
        ([b"data: [1, 2]\n\n"], "malformed_event"),
        ([chunk("a"), b"data: " + b"x" * (MAX_FRAME + 1)], "malformed_event"),
    ],
)
async def test_broken_streams_end_with_an_error_event_and_done(upstream, push: bool, parts: list[bytes], kind: str) -> None:  # type: ignore[no-untyped-def]
    out, result, _, _ = await run_relay(push=push, resp=await upstream(parts), strip_usage=True)
    assert result.error_kind == kind
    assert out.startswith(chunk("a")) or kind == "malformed_event"
    assert b"not json" not in out  # garbage never reaches the client
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2][len(b"data: "):])
    assert error["error"]["code"] == kind and error["error"]["type"] == "server_error"


async def test_upstream_error_event_is_passed_on(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    err = event({"error": {"message": "The request queue is full.", "type": "Service Unavailable", "code": 503}})
    out, result, _, _ = await run_relay(push=push, resp=await upstream([chunk("a"), err, DONE]), strip_usage=True)
    assert out == chunk("a") + err + DONE
    assert result.error_kind == "stream_error"


async def test_silent_upstream_hits_the_idle_timeout(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    out, result, _, _ = await run_relay(push=push, resp=await upstream([chunk("a")], hang=True), strip_usage=True, idle=0.2)
    assert result.error_kind == "idle_timeout"
    assert out.endswith(DONE) and b"idle_timeout" in out


async def test_an_exception_while_relaying_is_raised_in_the_request_task(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    # Pushed, it happens in the socket's read callback: it must not pass for an upstream failure.
    def on_token(now: float) -> None:
        raise RuntimeError("bookkeeping failed")

    cycle = Cycle()
    resp = await upstream([chunk("a"), DONE])
    with pytest.raises(RuntimeError, match="bookkeeping failed"):
        await relay_stream(
            resp, cycle.send, strip_usage=True, idle_timeout=5.0, on_first=lambda now: None, on_token=on_token, on_gap=lambda gap: None,
            writer=BodyWriter(cycle) if push else None,
        )
    resp.close()


class Transport:
    """The upstream socket, read by hand: records whether reading is paused."""

    def __init__(self) -> None:
        self.paused = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def test_a_client_that_cannot_keep_up_pauses_upstream_reading_without_an_idle_timeout() -> None:
    conn = Connection(lambda c: None, lambda c, was: None)
    socket = Transport()
    conn.connection_made(socket)  # type: ignore[arg-type]
    resp = WireResponse(conn)
    conn.send(b"", resp)
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(chunk("a") + chunk("b")))
    cycle = Cycle(pause_after=1)  # the client's buffer fills with the first event
    relay = asyncio.create_task(run_relay(resp, push=True, strip_usage=True, idle=0.05, cycle=cycle))
    async with asyncio.timeout(5):
        while not socket.paused:
            await asyncio.sleep(0.01)
    assert b"".join(cycle.sent) == chunk("a") + chunk("b")  # what was read is written; nothing more is read
    await asyncio.sleep(0.2)  # 4x the idle timeout: waiting on the client is no upstream silence
    assert not relay.done()
    cycle.flow.write_paused = False
    cycle.flow.drained.set()
    async with asyncio.timeout(5):
        while socket.paused:
            await asyncio.sleep(0.01)
    conn.data_received(chunked(chunk("c") + DONE) + b"0\r\n\r\n")
    out, result, _, _ = await relay
    assert out == chunk("a") + chunk("b") + chunk("c") + DONE
    assert result.error_kind is None and result.token_chunks == 3


async def test_a_read_of_whole_token_chunks_is_written_at_once() -> None:
    # The C check passes a read of plain token chunks on whole; anything else goes event by event.
    conn = Connection(lambda c: None, lambda c, was: None)
    conn.connection_made(Transport())  # type: ignore[arg-type]
    resp = WireResponse(conn)
    conn.send(b"", resp)
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(ROLE))
    cycle = Cycle()
    relay = asyncio.create_task(run_relay(resp, push=True, strip_usage=True, cycle=cycle))
    async with asyncio.timeout(5):
        while not cycle.sent:
            await asyncio.sleep(0.01)
    for part in (chunk("a") + chunk("b") + chunk("c"), chunk("d") + FINISH, DONE):
        conn.data_received(chunked(part))
    conn.data_received(b"0\r\n\r\n")
    out, result, gaps, firsts = await relay
    assert out == ROLE + chunk("a") + chunk("b") + chunk("c") + chunk("d") + FINISH + DONE
    assert cycle.sent == [ROLE, chunk("a") + chunk("b") + chunk("c"), chunk("d"), FINISH]  # [DONE]: the tail
    assert result.token_chunks == 4 and firsts == 1 and len(gaps) == 3


def test_the_body_writer_is_used_only_with_the_servers_own_send() -> None:
    cycle = Cycle()
    writer = BodyWriter(cycle)
    scope = {"extensions": {EXTENSION: writer}}

    async def wrapped(message: dict[str, Any]) -> None:
        await cycle.send(message)

    assert body_writer(scope, cycle.send) is writer
    assert body_writer(scope, wrapped) is None  # a middleware between them sees every body
    assert body_writer({}, cycle.send) is None  # any other ASGI server: the relay awaits `send`


async def test_a_relayed_stream_leaves_nothing_for_the_garbage_collector(upstream, push: bool) -> None:  # type: ignore[no-untyped-def]
    # Each stream's objects must go when it ends, by reference counting: cycles cost every request CPU.
    gc.collect()
    gc.disable()
    try:
        out, _, _, _ = await run_relay(push=push, resp=await upstream([chunk("a"), DONE]), strip_usage=True)
        assert out == chunk("a") + DONE
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if type(o).__name__ in ("_Push", "_Events", "WireResponse", "StreamResult")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
