"""The Responses-event and Ollama-NDJSON relays against a scripted upstream, and the response-home map."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.dialects.ollama import OLLAMA
from gateway.dialects.responses import RESPONSES
from gateway.pool.affinity import ResponseHomes, response_id_for
from gateway.relay import StreamResult
from gateway.upstream.http11 import WireResponse


def typed(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def line(**fields: Any) -> bytes:
    return orjson.dumps(fields) + b"\n"


CREATED = typed("response.created", response={"id": "resp_1", "status": "in_progress", "usage": None})
DELTA = typed("response.output_text.delta", delta=" a", item_id="msg_1")
ITEM_DONE = typed("response.output_item.done", item={"id": "msg_1"})
COMPLETED = typed("response.completed", response={"id": "resp_1", "usage": {"input_tokens": 7, "output_tokens": 2}})


async def run(relay: Any, resp: WireResponse, idle: float = 5.0) -> tuple[bytes, StreamResult, int]:
    sent: list[bytes] = []
    tokens = 0

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    def on_token(now: float) -> None:
        nonlocal tokens
        tokens += 1

    result = await relay(resp, send, strip_usage=False, idle_timeout=idle, on_first=lambda now: None, on_token=on_token,
                         on_gap=lambda gap: None)
    resp.close()
    return b"".join(sent), result, tokens


async def test_responses_events_pass_untouched_and_usage_comes_from_the_last(upstream) -> None:  # type: ignore[no-untyped-def]
    parts = [CREATED, DELTA, DELTA[:9], DELTA[9:], ITEM_DONE, COMPLETED]
    out, result, tokens = await run(RESPONSES.relay, await upstream(parts))
    assert out == b"".join(parts)
    assert result.error_kind is None and tokens == 2 and result.token_chunks == 2
    assert result.usage == {"prompt_tokens": 7, "completion_tokens": 2}


async def test_responses_stream_cut_before_its_last_event_ends_with_an_error_event(upstream) -> None:  # type: ignore[no-untyped-def]
    out, result, _ = await run(RESPONSES.relay, await upstream([CREATED, DELTA]))
    assert result.error_kind == "truncated" and result.usage is None
    tail = out[len(CREATED + DELTA) :]
    assert tail.startswith(b"event: error\ndata: ")
    assert orjson.loads(tail.split(b"data: ", 1)[1])["error"]["code"] == "truncated"


async def test_failed_response_is_relayed_and_marked(upstream) -> None:  # type: ignore[no-untyped-def]
    failed = typed("response.failed", response={"id": "resp_1", "status": "failed", "usage": None})
    out, result, _ = await run(RESPONSES.relay, await upstream([CREATED, failed]))
    assert out == CREATED + failed and result.error_kind == "stream_error"


async def test_ollama_lines_pass_untouched_and_counts_come_from_the_done_line(upstream) -> None:  # type: ignore[no-untyped-def]
    text = line(model="m", message={"role": "assistant", "content": " a"}, done=False)
    done = line(model="m", message={"role": "assistant", "content": ""}, done=True, prompt_eval_count=4, eval_count=2)
    out, result, tokens = await run(OLLAMA.relay, await upstream([text, text[:5], text[5:], done]))
    assert out == text * 2 + done
    assert tokens == 2 and result.error_kind is None
    assert result.usage == {"prompt_tokens": 4, "completion_tokens": 2}


async def test_ollama_garbage_ends_the_stream_with_an_ollama_error_line(upstream) -> None:  # type: ignore[no-untyped-def]
    text = line(model="m", response=" a", done=False)
    out, result, _ = await run(OLLAMA.relay, await upstream([text, b"{not json\n", text]))
    assert result.error_kind == "malformed_event"
    assert out.startswith(text) and orjson.loads(out[len(text) :])["error"].endswith("malformed_event")


@pytest.mark.parametrize("dialect", ["responses", "ollama"])
async def test_a_silent_upstream_hits_the_idle_timeout_once_and_the_client_is_told(upstream, dialect: str) -> None:  # type: ignore[no-untyped-def]
    relay, first = (RESPONSES.relay, CREATED) if dialect == "responses" else (OLLAMA.relay, line(model="m", response=" a", done=False))
    # Returning at all: the watch's cancel of the relaying task was taken back, not propagated.
    out, result, _ = await asyncio.wait_for(run(relay, await upstream([first, first], hang=True), idle=0.2), 5)
    assert result.error_kind == "idle_timeout"
    assert out.startswith(first * 2) and b"idle_timeout" in out[len(first) * 2 :]


def test_response_homes_forget_the_least_recently_used_beyond_capacity() -> None:
    homes = ResponseHomes(capacity=2)
    homes.remember("resp_a", "eagle")
    homes.remember("resp_b", "plain")
    assert homes.home_of("resp_a") == "eagle"  # now the most recently used
    homes.remember("resp_c", "plain")
    assert homes.home_of("resp_b") is None
    assert (homes.home_of("resp_a"), homes.home_of("resp_c"), len(homes)) == ("eagle", "plain", 2)


def test_an_id_the_gateway_made_names_its_backend_even_when_forgotten() -> None:
    made = response_id_for("plain-1")
    assert made.startswith("resp_") and len(made) == 45
    fresh = ResponseHomes()  # as another worker, or the gateway after a restart, would be
    assert fresh.home_of(made, ["eagle-0", "plain-1"]) == "plain-1"
    assert fresh.home_of(made, ["eagle-0"]) is None  # names no backend of this gateway


def test_unknown_response_has_no_home() -> None:
    assert ResponseHomes().home_of("resp_x") is None
    with pytest.raises(ValueError):
        ResponseHomes(capacity=0)


async def test_relays_do_not_wait_past_the_last_frame(upstream) -> None:  # type: ignore[no-untyped-def]
    # The last event ends the relay even though the (scripted) connection would send more.
    out, result, _ = await asyncio.wait_for(run(RESPONSES.relay, await upstream([COMPLETED, DELTA])), 5)
    assert out == COMPLETED and result.error_kind is None
