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
