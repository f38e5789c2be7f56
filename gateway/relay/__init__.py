"""From an upstream stream to the client: relays that forward each event's bytes as they came.

`sse.py` relays OpenAI-format SSE (chat, completions, SGLang's `/generate`), with `_sse.c` its
per-read fast path in C; `frames.py` relays any other framing event by event (the Responses API's
typed SSE, Ollama's NDJSON); `idle_watch.py` is the one idle timer per stream; `gaps.py` counts
inter-token gaps into a histogram once per stream; `pacing.py` lets new requests start only a few
per turn of the event loop while streams are relayed. The face holds what every relay returns.
May import `gateway.edge`, `gateway.upstream` and `gateway.errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# What one decoded chunk of a stream says: its usage so far (None: none) and whether it carries tokens.
ChunkReader = Callable[[dict[str, Any]], tuple[dict[str, Any] | None, bool]]


@dataclass
class StreamResult:
    """What the relay saw of one stream."""

    first_token_at: float | None = None
    last_token_at: float | None = None
    token_chunks: int = 0
    usage: dict[str, Any] | None = None
    error_kind: str | None = None  # None: the stream finished cleanly
    # The last finish reason of an event the relay decoded (a chat stream's own finish chunk; a
    # completions stream's rides on its last text chunk, relayed undecoded: None).
    finish_reason: str | None = None
    # The stream's last bytes ([DONE], or the error event and [DONE]), not yet sent: the caller sends
    # them with the response's end, one write instead of two. After a handoff: the last event relayed.
    tail: bytes = b""
    handed_off: bool = False  # ended between two events for another backend to continue (`Handoff`)


class Handoff:
    """A request that a stream end between two events, for another backend to continue it: made by
    whoever moves the request (`request`), read by the relay after each token event it relays."""

    __slots__ = ("target", "reason", "poke")

    def __init__(self) -> None:
        self.target: str | None = None  # the backend that continues it, once requested
        self.reason = "switch"  # why, as the move's count is labelled
        self.poke: Callable[[], None] | None = None  # the relay's: read no more reads past Python

    def request(self, target: str, reason: str = "switch") -> None:
        """End the stream after its next token event; `target` continues it (`reason`: why)."""
        self.target, self.reason = target, reason
        if self.poke is not None:
            self.poke()
