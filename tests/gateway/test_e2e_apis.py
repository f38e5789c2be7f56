"""End to end with real clients against `specgate serve`: the Responses API, OpenAI's extras on chat,
and the Ollama routes.

One gateway (two simulated backends with SGLang's response store on, field-8gpu at time-scale 0.1,
the threshold policy) serves the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import ollama
import openai
import orjson
import pytest

from backends.testbed import GatewayProcess
from tests.gateway.conftest import serving
from tests.gateway.test_e2e_faults import eventually

pytestmark = pytest.mark.timeout(180)

_STORE = '["--enable-response-store"]'
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    env = {
        "SPECGATE_LAUNCH__TIME_SCALE": "0.1",
        "SPECGATE_POLICY__NAME": "threshold",
        "SPECGATE_POLICY__THRESHOLD": "2",
        "SPECGATE_LAUNCH__EAGLE__EXTRA_ARGS": _STORE,
        "SPECGATE_LAUNCH__PLAIN__EXTRA_ARGS": _STORE,
    }
    yield from serving(env)


def inflight(gateway: GatewayProcess) -> int:
    return int(httpx.get(gateway.url + "/admin/status").json()["inflight"])


def requests_counted(gateway: GatewayProcess, endpoint: str) -> float:
    """specgate_requests_total summed over backends and statuses for `endpoint`, from /metrics."""
    total = 0.0
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith("specgate_requests_total{") and f'endpoint="{endpoint}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_responses_create_then_retrieve_from_the_backend_that_stored_it(
    gateway: GatewayProcess, client: openai.OpenAI, model: str
) -> None:
    raw = client.responses.with_raw_response.create(model=model, input="Say something.", max_output_tokens=8)
    response = raw.parse()
    assert response.id.startswith("resp_")
    assert response.output_text
    assert response.usage is not None and response.usage.output_tokens == 8
    assert response.status == "incomplete"  # it ran into max_output_tokens, as SGLang reports
    backend = raw.headers["x-specgate-backend"]

    retrieved = client.responses.with_raw_response.retrieve(response.id)
    assert retrieved.headers["x-specgate-backend"] == backend
    assert retrieved.parse().output_text == response.output_text
    assert inflight(gateway) == 0


def test_responses_stream_relays_sglang_events_and_counts_tokens(
    gateway: GatewayProcess, client: openai.OpenAI, model: str
) -> None:
    before = requests_counted(gateway, "responses")
    events = list(client.responses.create(model=model, input="Tell me a story.", max_output_tokens=12, stream=True))
    kinds = [event.type for event in events]
    final = events[-1].response  # type: ignore[union-attr]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete"
    assert kinds.count("response.output_text.delta") >= 2
    assert final.usage is not None and final.usage.output_tokens == 12
    assert final.output_text and len(final.output_text.split()) == 12
    assert client.responses.retrieve(final.id).output_text == final.output_text
    assert requests_counted(gateway, "responses") == before + 1
    assert inflight(gateway) == 0


def test_responses_follow_up_goes_where_its_predecessor_is(client: openai.OpenAI, model: str) -> None:
    first = client.responses.with_raw_response.create(model=model, input="Hello.", max_output_tokens=4)
    follow = client.responses.with_raw_response.create(
        model=model, input="And then?", previous_response_id=first.parse().id, max_output_tokens=4
    )
    assert follow.headers["x-specgate-backend"] == first.headers["x-specgate-backend"]
    assert follow.parse().previous_response_id == first.parse().id


def test_background_response_is_cancelled_on_its_backend(gateway: GatewayProcess, client: openai.OpenAI, model: str) -> None:
    queued = client.responses.with_raw_response.create(model=model, input="Go on.", max_output_tokens=50000, background=True)
    assert queued.parse().status == "queued"
    cancelled = client.responses.with_raw_response.cancel(queued.parse().id)
    assert cancelled.headers["x-specgate-backend"] == queued.headers["x-specgate-backend"]
    assert cancelled.parse().status == "cancelled"
    assert client.responses.retrieve(queued.parse().id).status == "cancelled"
    assert inflight(gateway) == 0  # the background generation holds no gateway slot


def test_unknown_response_id_is_an_openai_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve("resp_never_made")
    assert caught.value.body["code"] == "response_not_found"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_never_made")
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(input="Continue.", previous_response_id="resp_never_made")
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_chat_with_required_tool_returns_a_tool_call(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        seed=7,
        user="e2e",
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert set(orjson.loads(call.function.arguments)) == {"city", "days"}  # type: ignore[union-attr]


def test_streamed_chat_carries_tool_calls_in_deltas(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
        stream_options={"include_usage": True},
    )
    name, arguments, usage = None, "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name = call.function.name or name  # type: ignore[union-attr]
                arguments += call.function.arguments or ""  # type: ignore[union-attr]
    assert name == "get_weather"
    assert orjson.loads(arguments)["city"]
    assert usage is not None and usage.completion_tokens > 0


def test_chat_n_choices_with_logprobs(gateway: GatewayProcess, client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Pick a word."}],
        n=3,
        logprobs=True,
        top_logprobs=2,
        max_completion_tokens=5,
        stop=["never-in-output"],
    )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    for choice in completion.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    assert completion.usage is not None and completion.usage.completion_tokens == 15
    assert inflight(gateway) == 0


def test_streamed_chat_n_choices_interleave_through_the_gateway(gateway: GatewayProcess, client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Two words."}], n=2, max_tokens=4, stream=True
    )
    texts = {0: "", 1: ""}
    finishes = {}
    for chunk in stream:
        assert chunk.usage is None  # asked for on the client's behalf, stripped again
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length"}
    assert all(len(text.split()) == 4 for text in texts.values())
    assert inflight(gateway) == 0


def test_chat_n_choices_hold_n_in_flight_slots(gateway: GatewayProcess, client: openai.OpenAI, model: str) -> None:
    # SGLang decodes each of the n choices as a request of its own, so the slot counts n.
    with client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Many words."}], n=3, max_tokens=2000, stream=True
    ) as stream:
        next(iter(stream))
        assert inflight(gateway) == 3
    eventually(lambda: inflight(gateway) == 0, 5.0, "the client left: all three slots released")


def test_chat_json_schema_response_format(client: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "tags"],
    }
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "A person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    person = orjson.loads(completion.choices[0].message.content or "")
    assert isinstance(person["name"], str) and isinstance(person["age"], int) and isinstance(person["tags"], list)


def test_ollama_client_chat_generate_and_tags(gateway: GatewayProcess) -> None:
    client = ollama.Client(host=gateway.url)
    (listed,) = client.list().models
    assert client.show(listed.model or "").details.format == "sglang"  # type: ignore[union-attr]
    reply = client.chat(model=listed.model or "", messages=[{"role": "user", "content": "Hi"}], stream=False, options={"num_predict": 6})
    assert reply.done and reply.message.content and reply.eval_count == 6
    pieces = list(client.generate(model=listed.model or "", prompt="Once upon a time", options={"num_predict": 6}, stream=True))
    assert pieces[-1].done and not any(p.done for p in pieces[:-1])
    assert "".join(p.response for p in pieces).strip()
    assert inflight(gateway) == 0


def test_ollama_show_forwards_a_body_it_could_not_re_encode(gateway: GatewayProcess, model: str) -> None:
    # An integer past 64 bits parses (Python's json) but orjson cannot encode it: the body goes on as it came.
    body = b'{"model": "%s", "extra": 326281253769205733782222762765845528576}' % model.encode()
    resp = httpx.post(gateway.url + "/api/show", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 200 and resp.json()["details"]["format"] == "sglang"


def test_ollama_stream_is_ndjson_through_the_gateway(gateway: GatewayProcess, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 5}}
    with httpx.stream("POST", gateway.url + "/api/chat", json=body, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        lines = [orjson.loads(line) for line in resp.iter_lines() if line]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert all(line["done"] is False for line in lines[:-1]) and len(lines) >= 2
