"""Server-sent events decoding for OpenAI-style streams.

Hand-written because it measured faster than the libraries on the same aiohttp line stream
(`python -m loadtest.sse_bench`, results in docs/benchmarks/loadtest-sse.md); it follows the
WHATWG event-stream rules the load test needs: `data:` lines (one optional space after the
colon) accumulate until a blank line dispatches the event; comments and the `event`, `id` and
`retry` fields are ignored, as OpenAI streams do not use them.
"""

from __future__ import annotations


class SSEDecoder:
    """Feed it lines; it returns the event's data when a blank line completes an event."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: list[bytes] = []

    def feed(self, line: bytes) -> bytes | None:
        """Take one line (with or without its line ending); return a completed event's data."""
        line = line.rstrip(b"\r\n")
        if not line:
            if not self._data:
                return None
            data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
            self._data = []
            return data
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        return None
