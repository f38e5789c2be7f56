"""Request bodies of the OpenAI surface, validated at the edge.

Only what the gateway must be sure of is checked (types and ranges OpenAI and SGLang both
enforce); every other field, SGLang's extras included, is allowed and forwarded untouched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class _Sampling(_Open):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    # OpenAI's latency class, served as specgate's tier (gateway/tiers.py); not forwarded upstream.
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None

    @property
    def wants_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]


class ResponsesRequest(_Open):
    """POST /v1/responses (SGLang's `ResponsesRequest`; `model` may be left out, as SGLang allows)."""

    model: str | None = Field(default=None, min_length=1)
    input: str | list[Any]
    stream: bool = False
    store: bool | None = True
    background: bool | None = False
    previous_response_id: str | None = None
    request_id: str | None = Field(default=None, min_length=1)
    max_output_tokens: int | None = None


class OllamaMessage(_Open):
    role: str
    content: str


class _OllamaRequest(_Open):
    model: str
    stream: bool = True  # Ollama streams unless told not to
    options: dict[str, Any] | None = None


class OllamaChatRequest(_OllamaRequest):
    """POST /api/chat."""

    messages: list[OllamaMessage]


class OllamaGenerateRequest(_OllamaRequest):
    """POST /api/generate."""

    prompt: str


class OllamaShowRequest(_Open):
    """POST /api/show."""

    model: str


# What `surely_valid` accepts: exact JSON types only (pydantic's lax coercions, such as "1" for an
# int, are left to the full model, which also words every error).
_ROLES = frozenset(("system", "developer", "user", "assistant", "tool", "function"))


def _num(value: Any, low: float, high: float, *, low_open: bool = False) -> bool:
    if value is None:
        return True
    if type(value) not in (int, float):
        return False
    return (low < value if low_open else low <= value) and value <= high


def _int(value: Any, low: int, high: int | None = None) -> bool:
    return value is None or (type(value) is int and low <= value and (high is None or value <= high))


def _strs(value: Any) -> bool:
    return type(value) is list and all(type(v) is str for v in value)


def _sampling_ok(body: dict[str, Any]) -> bool:
    get = body.get
    model, stream, options, stop = get("model"), get("stream", False), get("stream_options"), get("stop")
    return (
        type(model) is str
        and model != ""
        and type(stream) is bool
        and (options is None or (type(options) is dict and type(options.get("include_usage", False)) in (bool, type(None))))
        and _int(get("max_tokens"), 0)
        and _num(get("temperature"), 0.0, 2.0)
        and _num(get("top_p"), 0.0, 1.0, low_open=True)
        and _int(get("n"), 1, 128)
        and (stop is None or type(stop) is str or _strs(stop))
        and _int(get("seed"), -(2**63))
        and _num(get("presence_penalty"), -2.0, 2.0)
        and _num(get("frequency_penalty"), -2.0, 2.0)
    )


def _message_ok(message: Any) -> bool:
    if type(message) is not dict or message.get("role") not in _ROLES:
        return False
    content = message.get("content")
    return content is None or type(content) is str or (type(content) is list and all(type(p) is dict for p in content))


def _prompt_ok(prompt: Any) -> bool:
    if type(prompt) is str:
        return True
    if type(prompt) is not list:
        return False
    return (
        all(type(p) is str for p in prompt)
        or all(type(p) is int for p in prompt)
        or all(type(p) is list and all(type(t) is int for t in p) for p in prompt)
    )


def surely_valid(endpoint: str, body: Any) -> bool:
    """True only when the `endpoint` ("chat" or "completions") model would accept `body` as it is.

    The proxied routes' fast path checks the parsed JSON with plain type tests instead of building
    the pydantic model (docs/benchmarks/design-notes.md#the-fast-path); False sends the request
    down the full route, whose model validates it again and words the error.
    """
    if type(body) is not dict or not _sampling_ok(body):
        return False
    if endpoint == "chat":
        messages = body.get("messages")
        return (
            type(messages) is list
            and len(messages) > 0
            and all(_message_ok(m) for m in messages)
            and _int(body.get("max_completion_tokens"), 0)
        )
    if endpoint == "completions":
        return "prompt" in body and _prompt_ok(body["prompt"])
    return False  # an endpoint without a quick check always takes the full route


def wants_usage(body: dict[str, Any]) -> bool:
    """The client asked for the usage chunk (`stream_options.include_usage`); `body` passed `surely_valid`."""
    options = body.get("stream_options")
    return bool(options and options.get("include_usage"))
