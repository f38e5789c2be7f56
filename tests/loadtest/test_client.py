"""The client against recorded OpenAI-shaped responses: cached tokens, the answer's text, what it sends."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web

from loadtest.client import TargetClient, TargetOptions, open_session
from loadtest.records import Exchange, RequestSpec
from tests.aioserve import serving_app

# Usage as SGLang sends it with --enable-cache-report, without it (null), and as servers that omit the field.
CACHED = {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123, "prompt_tokens_details": {"cached_tokens": 96}}
NULL = {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123, "prompt_tokens_details": None}
ABSENT = {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123}


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chat_stream(usage: dict[str, Any]) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " the"}}]}
    more = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " of and"}}]}
    return sse([chunk, more, {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}])


class Recorded:
    """Answers every request with `body` (SSE when it starts with `data:`) and keeps what it was sent."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.received: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(orjson.loads(await request.read()))
        kind = "text/event-stream" if self.body.startswith(b"data:") else "application/json"
        return web.Response(body=self.body, content_type=kind)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_post("/v1/completions", self.handle)
        return app


async def send(server: Recorded, spec: RequestSpec, **options: Any) -> Any:
    async with serving_app(server.app()) as url, open_session(4, 10) as session:
        return await TargetClient(session, url, "m", TargetOptions(**options)).send(spec)


SPEC = RequestSpec("next question", 10, 3)


@pytest.mark.parametrize("usage, cached", [(CACHED, 96), (NULL, 0), (ABSENT, 0)], ids=["reported", "null", "absent"])
async def test_a_stream_records_its_cached_tokens_and_its_answer(usage: dict[str, Any], cached: int) -> None:
    record = await send(Recorded(chat_stream(usage)), SPEC)
    assert record.ok and record.cached_tokens == cached and record.prompt_tokens == 120
    assert record.answer == " the of and"


@pytest.mark.parametrize("usage, cached", [(CACHED, 96), (NULL, 0), (ABSENT, 0)], ids=["reported", "null", "absent"])
async def test_a_whole_response_records_its_cached_tokens_and_its_text(usage: dict[str, Any], cached: int) -> None:
    chat = {"id": "c", "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": " a reply"}, "finish_reason": "length"}]}
    record = await send(Recorded(orjson.dumps(chat)), SPEC, stream=False)
    assert record.ok and record.cached_tokens == cached and record.answer == " a reply"
    completion = {"id": "c", "object": "text_completion", "usage": usage,
                  "choices": [{"index": 0, "text": " some text", "finish_reason": "length"}]}
    record = await send(Recorded(orjson.dumps(completion)), SPEC, stream=False, endpoint="completions")
    assert record.cached_tokens == cached and record.answer == " some text"


async def test_a_conversation_turn_sends_its_history_and_its_tier() -> None:
    server = Recorded(chat_stream(ABSENT))
    spec = RequestSpec("again?", 20, 3, system="be brief", history=(Exchange("hi", " hello"),), tier="flex")
    record = await send(server, spec)
    body = server.received[0]
    assert body["messages"] == spec.chat_messages() and body["service_tier"] == "flex" and record.tier == "flex"
    await send(server, SPEC)
    assert "service_tier" not in server.received[1]
    await send(server, spec, endpoint="completions")
    assert server.received[2]["prompt"] == "be brief\n\nhi\n\n hello\n\nagain?"
