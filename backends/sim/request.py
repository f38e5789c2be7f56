"""One generation request as the simulated server tracks it, and the error of a request it refuses.

The HTTP layer builds a `SimRequest` (its prompt as token ids, its output budget and stops); the
engine core moves it through waiting, running and finished or aborted, counting what it produced
and what its prompt reused from the prefix cache; the real-time engine sets `event` whenever a
streaming request gains tokens and when any request ends.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Literal

RequestState = Literal["waiting", "running", "finished", "aborted"]


class RequestError(ValueError):
    """A request the server refuses (SGLang answers these with a 400)."""


def max_req_input_len(context_length: int, kv_tokens: int) -> int:
    """The longest input SGLang's scheduler takes: `min(context - 1, KV - 1) - 5` (tp_worker.py)."""
    return min(context_length - 1, kv_tokens - 1) - 5


def check_context(prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
    """Raise SGLang's `RequestError` for a prompt, or a prompt and its output, longer than the context."""
    if prompt_tokens >= context_length:
        raise RequestError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    if prompt_tokens + max_new_tokens > context_length:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. You "
            f"requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens from the input "
            f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit."
        )


@dataclass(slots=True, eq=False)
class SimRequest:
    """One generation request as the engine sees it."""

    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    is_streaming: bool
    text_start: int
    stop: tuple[str, ...] = ()
    natural_stop: int | None = None  # token id reported when reaching max_new_tokens is the model's EOS
    prefix_cap: int | None = None  # most prompt tokens the prefix cache may serve; None: all but the last
    created: float = field(default_factory=time.time)
    state: RequestState = "waiting"
    produced: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache, known once admitted
    verify_steps: int = 0
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    text_limit: int | None = None  # output characters kept when a stop string matched
    arrived_at: float = 0.0
    first_token_at: float | None = None
    last_token_at: float = 0.0
    finished_at: float | None = None  # wall clock
    # The W3C trace context it came with (traceparent, tracestate): what SGLang parents its spans on.
    trace_headers: dict[str, str] = field(default_factory=dict)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    _chars: int = 0
    _tail: str = ""

    @property
    def prompt_tokens(self) -> int:
        """Length of the prompt in tokens."""
        return len(self.prompt_ids)

    @property
    def done(self) -> bool:
        """Finished or aborted."""
        return self.state == "finished" or self.state == "aborted"

    def record(self) -> dict[str, object]:
        """The request as listed by the test-only `/_test/requests` route."""
        return {
            "rid": self.rid,
            "state": self.state,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.produced,
            "created": self.created,
            "finished_at": self.finished_at,
            "finish_reason": self.finish_reason,
            "trace_headers": self.trace_headers,
        }
