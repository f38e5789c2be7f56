"""What the load generator records about each request: raw timings, never derived numbers.

Times are `time.perf_counter()` seconds. Everything a report shows is computed from these
records by `loadtest.stats`, so a recorded timeline can be replayed through the statistics
in a test with known answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Exchange:
    """An earlier turn of a conversation: what the user said and the answer the server returned."""

    user: str
    answer: str


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: its text, the exact number of tokens to generate, its service tier.

    `prompt` is the new user message; a conversation's request also re-sends its `system` prompt
    and the earlier turns (`history`). On chat they are messages (system, then user and assistant
    in turn, then the new user message); on completions one text, the same parts joined by blank
    lines (bench_serving's `f"{system}\n\n{question}"`). `input_len` counts every part's tokens
    under tokencount's rule, a chat template's tokens excluded.
    """

    prompt: str
    input_len: int
    output_len: int
    system: str = ""
    history: tuple[Exchange, ...] = ()
    tier: str | None = None  # OpenAI's `service_tier` field; None: not sent

    def chat_messages(self) -> list[dict[str, str]]:
        """The chat request's messages."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for turn in self.history:
            messages += [{"role": "user", "content": turn.user}, {"role": "assistant", "content": turn.answer}]
        messages.append({"role": "user", "content": self.prompt})
        return messages

    def completion_prompt(self) -> str:
        """The completions request's prompt."""
        parts = [self.system] if self.system else []
        for turn in self.history:
            parts += [turn.user, turn.answer]
        parts.append(self.prompt)
        return "\n\n".join(parts)


@dataclass
class RequestRecord:
    """The timeline of one request as the client saw it.

    `chunk_times[i]` is when the i-th SSE event that carried output text was read;
    `chunk_chars[i]` is how many characters of text it carried (used to split the usage token
    count across chunks when one chunk carries several tokens). For a non-streamed request
    there are no chunks.
    """

    start: float
    expected_output: int
    headers_at: float | None = None
    end: float | None = None
    status: int | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error_kind: str | None = None
    error_detail: str | None = None
    backend: str | None = None
    streamed: bool = True
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens; 0 where the server gives none
    tier: str | None = None  # the service tier the request asked for
    body_text: str = ""  # a non-streamed response's text (a stream's is its chunks)

    @property
    def ok(self) -> bool:
        """True when the request finished with a full response and no error."""
        return self.error_kind is None and self.end is not None

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first output text (to the whole body when not streamed)."""
        if not self.ok:
            return None
        if not self.streamed:
            return self.end - self.start  # type: ignore[operator]
        if not self.chunk_times:
            return None
        return self.chunk_times[0] - self.start

    @property
    def answer(self) -> str:
        """The text the server returned (what a conversation re-sends in its next turn)."""
        return "".join(self.chunk_texts) if self.streamed else self.body_text

    @property
    def e2e(self) -> float | None:
        """Seconds from sending to the end of the response."""
        if not self.ok:
            return None
        return self.end - self.start  # type: ignore[operator]


@dataclass
class LevelRun:
    """All requests of one target at one load level, with the level's wall-clock window."""

    started: float
    finished: float
    records: list[RequestRecord]

    @property
    def duration(self) -> float:
        """Seconds from the first request sent to the last one finished."""
        return max(self.finished - self.started, 1e-9)
