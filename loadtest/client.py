"""Sends one OpenAI-compatible request and records its timeline.

One `aiohttp.ClientSession` is shared by every request of a sweep (created by `open_session`);
a `TargetClient` only holds the URL, model and request options of one target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from loadtest.records import RequestRecord, RequestSpec
from loadtest.sse import SSEDecoder

Endpoint = Literal["chat", "completions"]
BACKEND_HEADER = "x-specgate-backend"
_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_DONE = b"[DONE]"


def open_session(max_connections: int, timeout: float) -> aiohttp.ClientSession:
    """The sweep's one long-lived session, with enough connections for the highest concurrency.

    A 1 MiB read buffer keeps long SSE lines from overflowing aiohttp's line reader.
    """
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout), read_bufsize=1 << 20)


@dataclass(frozen=True)
class TargetOptions:
    """How requests to one target are built."""

    endpoint: Endpoint = "chat"
    stream: bool = True
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # sent with every request (e.g. x-specgate-service-tier)


class TargetClient:
    """Sends requests to one OpenAI-compatible server and records what happened."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str, options: TargetOptions) -> None:
        self._session = session
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.options = options
        self._url = self.base_url + _PATHS[options.endpoint]
        self._headers = {"Content-Type": "application/json"}
        self._headers.update(options.headers)
        if options.api_key:
            self._headers["Authorization"] = f"Bearer {options.api_key}"

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        """The request body: exact output length via `ignore_eos` + `max_tokens`, usage requested."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_len,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": self.options.stream,
        }
        if self.options.endpoint == "chat":
            body["messages"] = spec.chat_messages()
        else:
            body["prompt"] = spec.completion_prompt()
        if self.options.stream:
            body["stream_options"] = {"include_usage": True}
        if spec.tier is not None:
            body["service_tier"] = spec.tier
        return body

    async def send(self, spec: RequestSpec) -> RequestRecord:
        """Send one request; never raises for request failures, they are recorded instead."""
        payload = orjson.dumps(self.body(spec))
        record = RequestRecord(
            start=time.perf_counter(), expected_output=spec.output_len, streamed=self.options.stream, tier=spec.tier
        )
        try:
            async with self._session.post(self._url, data=payload, headers=self._headers) as resp:
                record.headers_at = time.perf_counter()
                record.status = resp.status
                record.backend = resp.headers.get(BACKEND_HEADER)
                if resp.status != 200:
                    record.error_kind = f"http_{resp.status}"
                    record.error_detail = (await resp.text())[:300]
                    return record
                if self.options.stream:
                    await self._read_stream(resp, record)
                else:
                    self._read_body(await resp.read(), record)
                    record.end = time.perf_counter()
        except TimeoutError:
            record.error_kind = "timeout"
        except aiohttp.ClientConnectorError as exc:
            record.error_kind = "connect"
            record.error_detail = str(exc)[:300]
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            record.error_kind = "disconnected"
            record.error_detail = str(exc)[:300]
        except aiohttp.ClientError as exc:
            record.error_kind = "client_error"
            record.error_detail = f"{type(exc).__name__}: {exc}"[:300]
        except orjson.JSONDecodeError as exc:
            record.error_kind = "bad_json"
            record.error_detail = str(exc)[:300]
        return record

    async def _read_stream(self, resp: aiohttp.ClientResponse, record: RequestRecord) -> None:
        decoder = SSEDecoder()
        chat = self.options.endpoint == "chat"
        async for line in resp.content:
            data = decoder.feed(line)
            if data is None:
                continue
            if data == _DONE:
                record.end = time.perf_counter()
                return
            event = orjson.loads(data)
            if "error" in event:
                record.error_kind = "stream_error"
                record.error_detail = orjson.dumps(event["error"]).decode()[:300]
                return
            usage = event.get("usage")
            if usage:
                _take_usage(usage, record)
            choices = event.get("choices")
            if not choices:
                continue
            text = _chunk_text(choices[0], chat)
            if text:
                record.chunk_times.append(time.perf_counter())
                record.chunk_texts.append(text)
        record.error_kind = "incomplete"
        record.error_detail = "stream ended without data: [DONE]"

    def _read_body(self, raw: bytes, record: RequestRecord) -> None:
        body = orjson.loads(raw)
        usage = body.get("usage")
        if usage:
            _take_usage(usage, record)
        choices = body.get("choices")
        if choices:
            message = choices[0].get("message")
            record.body_text = (message.get("content") if message else choices[0].get("text")) or ""


def _chunk_text(choice: dict[str, Any], chat: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    # Reasoning models stream thoughts separately; they are output tokens all the same.
    return (delta.get("reasoning_content") or "") + (delta.get("content") or "")


def _take_usage(usage: dict[str, Any], record: RequestRecord) -> None:
    record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
    record.completion_tokens = usage.get("completion_tokens", record.completion_tokens)
    # SGLang fills prompt_tokens_details only with --enable-cache-report; null or absent leaves 0.
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached:
        record.cached_tokens = cached


async def served_model(session: aiohttp.ClientSession, base_url: str, api_key: str | None) -> str:
    """The first model id the server lists at `GET /v1/models` (raises with a clear message)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"GET {url} answered {resp.status}: {(await resp.text())[:200]}")
            cards = orjson.loads(await resp.read()).get("data") or []
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise RuntimeError(f"cannot reach {url}: {exc}") from exc
    if not cards:
        raise RuntimeError(f"GET {url} lists no model")
    return str(cards[0]["id"])
