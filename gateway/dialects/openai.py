"""OpenAI's chat and text completions as SGLang serves them: the base `Dialect` every API family refines.

A dialect says, for one API family: where a body names its output limit (the policy's expected
length), what the gateway adds before forwarding it, where a whole response keeps its token counts,
how a stream is relayed and how errors reach the client. OpenAI's streams are SSE `data:` events
ending in `[DONE]`; the response says which service tier served it when the client named one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import Send

from gateway.errors import OpenAIError, upstream_error
from gateway.relay import ChunkReader, StreamResult
from gateway.relay.sse import DONE, read_openai_chunk, relay_stream
from gateway.tiers import TIER_FIELD, Tier
from gateway.upstream.http11 import WireResponse

Body = dict[str, Any]
_SSE = b"text/event-stream; charset=utf-8"
# SGLang's constrained decoding: a grammar matches a whole answer, not the rest of one.
_CONSTRAINED = ("regex", "json_schema", "ebnf", "structural_tag")
# What a chat template renders a prompt with besides its messages (a tokenize body needs them too).
_TEMPLATE_KEYS = ("chat_template_kwargs", "reasoning_effort")


def positive_int(value: Any) -> bool:
    """Whether `value` is an int above zero (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class Dialect:
    """OpenAI's chat and text completions, as SGLang serves them; other APIs override what differs."""

    stream_content_type: bytes = _SSE

    def max_tokens(self, body: Body) -> int | None:
        """The client's limit on output tokens per sequence, when it gave one: `max_completion_tokens`, else `max_tokens`."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if positive_int(value):
                return value  # type: ignore[no-any-return]
        return None

    def upstream_body(
        self, body: Body, *, served_model: str | None, stream: bool, client_wants_usage: bool, request_id: str
    ) -> Body:
        """The JSON to send upstream: `model` rewritten, usage asked for, and a `rid` SGLang can abort by."""
        body = dict(body)
        if served_model:
            body["model"] = served_model
        if stream and not client_wants_usage:
            # Token counts come from usage; the extra chunk is stripped from what the client sees.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if "rid" not in body and body.get("n") in (None, 1):
            body["rid"] = request_id  # lets SGLang's /abort_request and logs name this request
        return body

    def prompt_text(self, body: Body) -> bytes | None:
        """The request's prompt as the bytes its prefix is keyed on (pool/prefix.py); None: no single prompt.

        Chat messages are keyed in order, role and content, so a conversation's next turn extends its
        last turn's key; equal text gives equal keys whatever the backend's template.
        """
        messages = body.get("messages")
        if messages is not None:
            return messages_text(messages)
        prompt = body.get("prompt")
        return prompt.encode("utf-8", "surrogatepass") if isinstance(prompt, str) else None

    def usage(self, response: Any) -> Body | None:
        """Token counts (`prompt_tokens`, `completion_tokens`) of a whole decoded response body."""
        if not isinstance(response, dict):
            raise ValueError("not a JSON object")
        return response.get("usage")

    def chunk_reader(self) -> ChunkReader:
        """A reader for one stream's events (it may keep state across them)."""
        return read_openai_chunk

    async def relay(self, resp: WireResponse, send: Send, **options: Any) -> StreamResult:
        """Relay one upstream stream to the client (`relay_stream`'s keyword options)."""
        return await relay_stream(resp, send, read=self.chunk_reader(), **options)

    def stream_error(self, err: OpenAIError) -> bytes:
        """The bytes that end a stream whose headers are already sent."""
        return err.sse_event() + DONE

    def continues(self, body: Body) -> bool:
        """Whether another backend can go on with this request's streamed answer (`continuation`): one
        choice of a chat or of one string prompt, no tools, log probabilities, echo or constrained
        output (a grammar would start again in the middle of the answer)."""
        if body.get("n") not in (None, 1) or body.get("logprobs") or body.get("tools") or body.get("echo"):
            return False
        if any(body.get(key) is not None for key in _CONSTRAINED):
            return False
        fmt = body.get("response_format")
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            return False
        messages = body.get("messages")
        if messages is not None:
            return isinstance(messages, list) and bool(messages)
        return isinstance(body.get("prompt"), str)

    def continuation(self, body: Body, text: str) -> tuple[Body, Body, Body]:
        """How another backend goes on with a streamed answer that has `text` so far (a request that
        `continues`): the body that asks it to (chat: the answer given back as a last assistant message
        SGLang continues, `continue_final_message`; completions: the prompt with the text appended),
        and the two `/v1/tokenize` bodies whose counts differ by the given text's tokens (the original
        prompt, the continued one). The caller lowers the output limit (`with_limit`) once it knows
        the given tokens."""
        model = body.get("model")
        messages = body.get("messages")
        if messages is not None:
            given = [*messages, {"role": "assistant", "content": text}]
            rendering = {key: body[key] for key in _TEMPLATE_KEYS if key in body}
            return (
                {**body, "messages": given, "continue_final_message": True},
                {"model": model, "messages": messages, **rendering},
                {"model": model, "messages": given, "continue_final_message": True, **rendering},
            )
        prompt = body["prompt"]
        return {**body, "prompt": prompt + text}, {"model": model, "prompt": prompt}, {"model": model, "prompt": prompt + text}

    def with_limit(self, body: Body, given: int) -> Body:
        """`body` with its output limit lowered by `given` tokens already produced (at least 1 left)."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if positive_int(value):
                return {**body, key: max(value - given, 1)}
        return body

    def upstream_error(self, status: int, payload: bytes) -> OpenAIError:
        """The error the client gets for an upstream error response."""
        return upstream_error(status, payload)


class BodyOnlyModel(Dialect):
    """An API whose body the gateway forwards with only `model` rewritten (no usage request, no `rid`)."""

    def continues(self, body: Body) -> bool:
        return False  # its answers are not handed on

    def upstream_body(
        self, body: Body, *, served_model: str | None, stream: bool, client_wants_usage: bool, request_id: str
    ) -> Body:
        return {**body, "model": served_model} if served_model else dict(body)


OPENAI = Dialect()


def messages_text(messages: Any) -> bytes | None:
    """Chat messages as prefix-key bytes: each message's role and text content, separated."""
    if not isinstance(messages, list):
        return None
    parts: list[bytes] = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        if not isinstance(content, str):
            # Content parts, tool calls: keyed on their JSON, which is as stable as the client's.
            try:
                content = orjson.dumps([content, message.get("tool_calls")], option=orjson.OPT_SORT_KEYS).decode()
            except orjson.JSONEncodeError:  # nested deeper than JSON can be written back: no key, routed on load
                return None
        parts.append(f"\x1e{message.get('role')}\x1f{content}".encode("utf-8", "surrogatepass"))
    return b"".join(parts)


def echo_json(payload: bytes, tier: Tier) -> bytes:
    """A JSON response body with `service_tier` set to the tier served (unchanged if not an object)."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    if not isinstance(body, dict):
        return payload
    body[TIER_FIELD] = tier
    return orjson.dumps(body)


def stream_echo(tier: Tier) -> Callable[[bytes], bytes]:
    """What puts `"service_tier": tier` in each chunk event of a stream (see `echo_stream_event`)."""
    field = b'"service_tier":"' + tier.encode() + b'",'
    return lambda event: echo_stream_event(event, field)


def echo_stream_event(event: bytes, field: bytes) -> bytes:
    """One `data: {...}` SSE event with `field` (a `"key":"value",` member) as its object's first member.

    Splicing the bytes keeps the relay's exact-bytes forwarding (no re-encoding); an event that
    already names a tier is left as it is.
    """
    start = event.find(b"{")
    if start < 0 or b'"service_tier"' in event or event[start + 1 : start + 2] == b"}":
        return event
    return event[: start + 1] + field + event[start + 1 :]
