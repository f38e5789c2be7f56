"""The relay's C sink (`gateway/relay/_sse.c`) takes exactly the reads whose every event tokens_by_bytes calls a token chunk.

Everything the sink does with such a read is checked end to end in tests/gateway/test_relay.py, which
runs every relay test with the sink and without it.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from gateway.relay import StreamResult
from gateway.relay import sse as relay
from gateway.relay._sse import TokenSink
from gateway.relay.sse import tokens_by_bytes



def reference(data: bytes) -> int:
    """What the C function must answer: tokens_by_bytes over each event, in Python."""
    events, start = 0, 0
    while start < len(data):
        at = data.find(b"\n\n", start)
        if at < 0 or not tokens_by_bytes(data[start : at + 2]):
            return 0
        events, start = events + 1, at + 2
    return events


class Client:
    """The client's transport and flow control, as the sink sees them."""

    write_paused = False

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False


class Watch:
    reading_since: float | None = None


def token_events(data: bytes) -> int:
    """How many token chunks the sink counted in `data` itself; 0 when it passed `data` to the Python relay."""
    slow: list[bytes] = []
    result = StreamResult()
    client = Client()
    sink = TokenSink(
        slow=slow.append, fail=pytest.fail, pause=list, result=result, on_first=float, on_gap=float,
        on_token=float, transport=client, flow=client, watch=Watch(), loop_time=float,
    )
    sink.data(data)
    sink.close()
    assert (slow == [data]) != (result.token_chunks > 0)
    if result.token_chunks:
        assert client.written == [b"%x\r\n%b\r\n" % (len(data), data)]
    return result.token_chunks


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat(delta: dict[str, Any], **extra: Any) -> bytes:
    return sse({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra})


EVENTS = [
    chat({"role": None, "content": "a"}, usage=None),  # SGLang's token chunk
    chat({"content": "a"}),
    chat({"reasoning_content": "think"}, usage=None),
    chat({"content": "", "reasoning_content": "think"}, usage=None),
    chat({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, usage=None),
    chat({"tool_calls": []}, usage=None),
    chat({"content": '"quoted" "content":"x'}, usage=None),
    chat({"role": "assistant", "content": ""}, usage=None),
    chat({}, usage=None),
    chat({"content": "a"}, usage={"completion_tokens": 3}),
    sse({"id": "x", "choices": [{"index": 0, "text": " word", "finish_reason": None}], "usage": None}),
    sse({"id": "x", "choices": [{"index": 0, "text": ""}], "usage": None}),
    sse({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
    sse({"error": {"message": "The request queue is full.", "code": 503}}),
    sse({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}], "error": {"message": "aborted"}, "usage": None}),
    b'data: {"choices": [{"delta": {"content": "spaced"}}]}\n\n',
    b"data: [DONE]\n\n",
    b": keep-alive\n\n",
    b"\n\n",
    b"data: {}\n\n",
    b'data: {"content":"\n\n',
]


def test_the_relay_uses_the_extension() -> None:
    # The relay tests' "push" runs go through it (and "push without C" without it).
    assert relay.TokenSink is not None


@pytest.mark.parametrize("event", EVENTS)
def test_each_event_alone_gets_the_python_answer(event: bytes) -> None:
    assert token_events(event) == reference(event)


def test_sglang_token_chunks_are_counted_and_anything_else_stops_the_count() -> None:
    token = EVENTS[0]
    assert token_events(token) == 1
    assert token_events(token * 3) == 3
    assert token_events(token * 2 + b"data: [DONE]\n\n") == 0  # [DONE] ends the stream in Python
    assert token_events(token[:-1]) == 0  # half an event
    assert token_events(token + token[:20]) == 0
    assert token_events(b"") == 0


def test_reads_cut_anywhere_and_mixed_get_the_python_answer() -> None:
    rng = random.Random(13)
    stream = b"".join(rng.choice(EVENTS) for _ in range(400))
    for _ in range(3000):
        start = rng.randrange(len(stream))
        data = stream[start : start + rng.randrange(1, 1200)]
        assert token_events(data) == reference(data), data


def test_mutated_events_get_the_python_answer() -> None:
    # Bytes flipped to the characters the check looks for, so near misses of every rule are tried.
    rng = random.Random(7)
    alphabet = b'"{}:[],\n\\ aeusgrtx'
    for _ in range(5000):
        event = bytearray(rng.choice(EVENTS[:15]))
        for _ in range(rng.randrange(1, 4)):
            event[rng.randrange(len(event))] = rng.choice(alphabet)
        data = bytes(event) * rng.randrange(1, 3)
        assert token_events(data) == reference(data), data


def test_a_read_that_is_not_bytes_goes_to_the_python_relay() -> None:
    slow: list[Any] = []
    sink = TokenSink(
        slow=slow.append, fail=pytest.fail, pause=list, result=StreamResult(), on_first=float, on_gap=float,
        on_token=float, transport=Client(), flow=Client(), watch=Watch(), loop_time=float,
    )
    sink.data(bytearray(EVENTS[0]))
    sink.close()
    sink.data(EVENTS[0])  # closed: nothing more happens
    assert slow == [bytearray(EVENTS[0])]


def make_sink(client: Client, watch: Watch, calls: list[Any], **overrides: Any) -> TokenSink:
    callbacks: dict[str, Any] = {
        "slow": lambda data: calls.append(("slow", data)),
        "fail": lambda exc: calls.append(("fail", exc)),
        "pause": lambda: calls.append(("pause",)),
        "on_first": lambda now: calls.append(("first", now)),
        "on_gap": lambda gap: calls.append(("gap", gap)),
        "on_token": lambda now: calls.append(("token", now)),
    }
    callbacks.update(overrides)
    return TokenSink(result=StreamResult(), transport=client, flow=client, watch=watch, loop_time=lambda: 42.0, **callbacks)


def test_the_sink_tallies_writes_and_rearms_the_watch_as_the_python_relay_does() -> None:
    client, watch, calls = Client(), Watch(), []
    sink = make_sink(client, watch, calls)
    token = EVENTS[0]
    sink.data(token)
    sink.data(token * 2)
    kinds = [c[0] for c in calls]
    assert kinds == ["first", "token", "gap", "token", "gap", "token"]
    first, last_read = calls[0][1], calls[3][1]
    assert calls[2][1] == pytest.approx(last_read - first) and calls[4][1] == 0.0  # one read: one arrival time
    assert client.written == [b"%x\r\n%b\r\n" % (len(d), d) for d in (token, token * 2)]
    assert watch.reading_since == 42.0


def test_a_half_read_event_sends_every_read_to_the_python_relay_until_it_is_whole_again() -> None:
    client, watch, calls = Client(), Watch(), []
    sink = make_sink(client, watch, calls)
    sink.whole = False
    sink.data(EVENTS[0])
    assert calls == [("slow", EVENTS[0])] and client.written == []
    sink.whole = True
    sink.data(EVENTS[0])
    assert [c[0] for c in calls[1:]] == ["first", "token"]


def test_a_full_client_buffer_pauses_and_a_closed_client_is_not_written_to() -> None:
    client, watch, calls = Client(), Watch(), []
    sink = make_sink(client, watch, calls)
    client.write_paused = True
    sink.data(EVENTS[0])
    assert calls[-1] == ("pause",) and watch.reading_since is None
    client.is_closing = lambda: True  # type: ignore[method-assign]
    sink.data(EVENTS[0])
    assert len(client.written) == 1 and calls[-2][0] == "token"  # counted, not written


def test_an_error_in_a_callback_goes_to_fail_and_anything_else_propagates() -> None:
    client, watch, calls = Client(), Watch(), []

    def broken(now: float) -> None:
        raise RuntimeError("bookkeeping failed")

    sink = make_sink(client, watch, calls, on_token=broken)
    sink.data(EVENTS[0])
    assert calls[-1][0] == "fail" and str(calls[-1][1]) == "bookkeeping failed"
    assert client.written == []  # as the Python relay: nothing is written after a failed tally

    def interrupted(now: float) -> None:
        raise KeyboardInterrupt

    sink = make_sink(client, watch, calls, on_token=interrupted)
    with pytest.raises(KeyboardInterrupt):
        sink.data(EVENTS[0])
