"""SSE decoding of OpenAI-style streams."""

from __future__ import annotations

from loadtest.sse import SSEDecoder


def events(lines: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    return [data for line in lines if (data := decoder.feed(line)) is not None]


def test_data_lines_are_dispatched_at_blank_lines() -> None:
    lines = [b'data: {"a":1}\n', b"\n", b'data: {"b":2}\n', b"\n", b"data: [DONE]\n", b"\n"]
    assert events(lines) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


def test_crlf_comments_other_fields_and_missing_space() -> None:
    lines = [b": keep-alive\r\n", b"event: message\r\n", b"id: 7\r\n", b"data:{\"x\":1}\r\n", b"\r\n"]
    assert events(lines) == [b'{"x":1}']


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert events([b"data: first\n", b"data: second\n", b"\n"]) == [b"first\nsecond"]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert events([b"\n", b"\n", b": comment\n", b"\n"]) == []


def test_an_event_cut_off_before_its_blank_line_is_not_dispatched() -> None:
    assert events([b"data: {\"half\": true}\n"]) == []
