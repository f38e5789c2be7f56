"""Request bodies the simulator accepts (OpenAI plus SGLang extras) and SGLang's error body shapes.

Only the fields that shape the simulation are typed (chat's `tools`, `tool_choice`, `logprobs`,
`top_logprobs` and `response_format` among them); every other field OpenAI or SGLang defines
(temperature, top_p, `priority`, `separate_reasoning`, `chat_template_kwargs`, ...) and any unknown
field is accepted and ignored, as SGLang ignores fields it does not know.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, field_validator
from starlette.responses import Response

CHAT_ROLES = ("system", "user", "assistant", "tool", "function", "developer")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _GenerationRequest(_Body):
    model: str = "default"
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False
    rid: str | list[str] | None = None
    return_spec_tokens_details: bool = False

    @field_validator("max_tokens", "max_completion_tokens", check_fields=False)
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("max_tokens must be positive")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        """Non-empty stop strings, as a tuple."""
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)

    def request_id(self) -> str | None:
        """The caller's `rid` (a one-element list counts as one rid)."""
        if isinstance(self.rid, list):
            return self.rid[0] if len(self.rid) == 1 else None
        return self.rid

    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role.lower() not in CHAT_ROLES:
            raise ValueError(f"'role' must be one of {', '.join(repr(r) for r in CHAT_ROLES)} (case-insensitive).")
        return role.lower()

    def text(self) -> str:
        """The message's text; only the text parts of a multi-part content count."""
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return " ".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    # OpenAI extras the simulated model answers in SGLang's shape (see `backends/sim/chat_extras.py`).
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool = False

    def requested_max_tokens(self) -> int | None:
        """SGLang's rule: max_completion_tokens, else max_tokens."""
        return self.max_completion_tokens or self.max_tokens

    def prompt_messages(self) -> tuple[list[tuple[str, str]], str | None]:
        """The (role, text) messages the template renders, and the text the prompt then ends with (None: none).

        SGLang's handling of a last assistant message whose content is a string: with
        `continue_final_message` it leaves the template and its text follows the assistant header (the
        model continues it); without, it is rendered as a user message.
        """
        messages = [(m.role, m.text()) for m in self.messages]
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant" or not isinstance(last.content, str):
            return messages, None
        if self.continue_final_message:
            return messages[:-1], last.content
        return messages[:-1] + [("user", last.content)], None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = 16  # OpenAI's and SGLang's default for completions

    def requested_max_tokens(self) -> int:
        """The output budget."""
        return self.max_tokens


class AbortRequest(_Body):
    rid: str = ""
    abort_all: bool = False


Kind = Literal["chat", "completion"]


def error_body(message: str, status: int = HTTPStatus.BAD_REQUEST, err_type: str = "BadRequestError") -> dict[str, Any]:
    """SGLang's `ErrorResponse` for the OpenAI routes."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": int(status)}


def json_response(content: Any, status: int = 200) -> Response:
    """A JSON response encoded with orjson."""
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def error_response(message: str, status: int = HTTPStatus.BAD_REQUEST, err_type: str = "BadRequestError") -> Response:
    """An SGLang OpenAI-route error as a response."""
    return json_response(error_body(message, status, err_type), status)


def model_not_found(model: str) -> Response:
    """SGLang's 404 for `GET /v1/models/{id}` of a model it does not serve."""
    return json_response(
        {
            "error": {
                "message": f"The model '{model}' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        },
        404,
    )
