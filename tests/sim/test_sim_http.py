"""SGLang's HTTP contract, driven with the real `openai` client and raw HTTP where framing matters."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from backends.sim.tokenizer import count_tokens
from backends.testbed import SimHandle

MODEL = "specgate-sim/field-8gpu"


@pytest.fixture(scope="module")
def client(eagle: SimHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=eagle.url() + "/v1", api_key="unused", max_retries=0, timeout=20)


def sse_events(raw: bytes) -> list[bytes]:
    """The `data:` payloads of an SSE body; asserts the framing is `data: ...\\n\\n` throughout."""
    assert raw.endswith(b"\n\n")
    events = raw[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events), events
    return [e[len(b"data: ") :] for e in events]


def test_chat_non_streaming_runs_to_max_tokens(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "hello there"}], max_tokens=12
    )
    choice = reply.choices[0]
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == "anything"  # SGLang echoes the requested model
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert count_tokens(choice.message.content) == 12  # the pseudo-text re-tokenizes to what was generated


def test_chat_stream_framing_chunks_and_usage(eagle: SimHandle) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count to ten"}],
        "max_tokens": 30,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = httpx.post(eagle.url() + "/v1/chat/completions", json=body, timeout=20)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.content)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    finish = chunks[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 30
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert count_tokens(text) == 30
    # EAGLE emits a whole step's tokens as one chunk: fewer content chunks than tokens.
    assert len(chunks) - 3 < 30


def test_openai_client_reads_the_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert usage is not None and usage.completion_tokens == 9
    assert reasons[-1] == "length"
    assert count_tokens("".join(parts)) == 9


def test_completions_stream_and_non_stream(client: openai.OpenAI, eagle: SimHandle) -> None:
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 20
    assert whole.usage.prompt_tokens == 4

    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(httpx.post(eagle.url() + "/v1/completions", json=body, timeout=20).content)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
    texts = [c["choices"][0] for c in chunks[:-1]]
    assert [t["finish_reason"] for t in texts[:-1]] == [None] * (len(texts) - 1)
    assert texts[-1]["finish_reason"] == "length"
    # Same seed and prompt: the stream carries the same text as the whole response.
    assert "".join(t["text"] for t in texts) == whole.choices[0].text


def test_default_completions_length_is_16(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="a b c")
    assert reply.usage.completion_tokens == 16


def test_stop_string_ends_with_stop_and_matched_stop(client: openai.OpenAI) -> None:
    prompt = "tell me a story"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40).choices[0].text
    word = full.split()[6]
    cut = full.index(" " + word)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, stop=[" " + word])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["matched_stop"] == " " + word
    assert choice.text == full[:cut]
    assert reply.usage.completion_tokens < 40


def test_chat_without_max_tokens_stops_at_simulated_eos(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == 256  # field-8gpu's default_max_tokens
    assert reply.choices[0].model_extra["matched_stop"] == 2


def test_extras_and_unknown_fields_are_accepted(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        max_tokens=3,
        extra_body={
            "ignore_eos": True,
            "priority": 1,
            "separate_reasoning": False,
            "chat_template_kwargs": {"enable_thinking": False},
            "no_such_field": {"x": 1},
        },
    )
    assert reply.usage.completion_tokens == 3


def test_rid_is_the_request_id_and_is_listed(client: openai.OpenAI, eagle: SimHandle) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5, extra_body={"rid": "rid-contract-1"}
    )
    assert reply.id == "rid-contract-1"
    listed = httpx.get(eagle.url() + "/_test/requests", params={"rid": "rid-contract-1"}).json()
    assert [(r["state"], r["completion_tokens"], r["finish_reason"]) for r in listed] == [("finished", 5, "length")]


def test_spec_token_details_in_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=60,
        extra_body={"return_spec_tokens_details": True},
    )
    usage = reply.usage.model_extra
    assert 2.0 < usage["spec_accept_length"] <= 4.0
    assert usage["spec_verify_ct"] >= 59 / 4


@pytest.mark.parametrize(
    ("body", "needle", "err_type"),
    [
        ({"model": MODEL, "messages": []}, "Messages cannot be empty.", "BadRequestError"),
        ({"model": MODEL}, "body.messages: Field required", "Bad Request"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens must be positive",
            "Bad Request",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 200000},
            "Requested token count exceeds the model's maximum context length of 131072 tokens",
            "BadRequestError",
        ),
        (
            {"model": MODEL, "prompt": "x", "n": 2},
            "n > 1 is supported by the simulated server on chat completions only",
            "BadRequestError",
        ),
        ({"model": MODEL, "prompt": ""}, "Prompt cannot be empty", "BadRequestError"),
    ],
)
def test_errors_have_sglang_shape(eagle: SimHandle, body: dict[str, object], needle: str, err_type: str) -> None:
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    resp = httpx.post(eagle.url() + path, json=body)
    assert resp.status_code == 400
    error = resp.json()
    assert set(error) == {"object", "message", "type", "param", "code"}
    assert error["object"] == "error" and error["code"] == 400 and error["type"] == err_type
    assert needle in error["message"]


def test_streaming_validation_error_is_a_real_400(eagle: SimHandle) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 200000, "stream": True}
    resp = httpx.post(eagle.url() + "/v1/chat/completions", json=body)
    assert resp.status_code == 400 and resp.json()["object"] == "error"


def test_prompt_longer_than_context(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[0] * 131072, max_tokens=1)
    assert "is longer than the model's context length (131072 tokens)" in str(err.value)


def test_non_json_content_type_is_refused(eagle: SimHandle) -> None:
    resp = httpx.post(eagle.url() + "/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert resp.status_code == 400 and "application/json" in resp.json()["message"]


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    cards = client.models.list().data
    assert [c.id for c in cards] == [MODEL]
    assert cards[0].owned_by == "sglang" and cards[0].model_extra["max_model_len"] == 131072
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found"


def test_duplicate_running_rid_is_refused(eagle: SimHandle) -> None:
    url = eagle.url() + "/v1/chat/completions"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2000,
        "stream": True,
        "rid": "dup-1",
    }
    with httpx.stream("POST", url, json=body, timeout=20) as first:
        chunks = first.iter_bytes()  # kept referenced: dropping the iterator closes the stream
        next(chunks)
        second = httpx.post(url, json={**body, "stream": False})
        assert second.status_code == 400 and "Duplicate request ID" in second.json()["message"]


def test_info_routes(eagle: SimHandle) -> None:
    base = eagle.url()
    info = httpx.get(base + "/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 4
    assert info["max_running_requests"] == 48 and info["version"] == "0.5.23"
    # SGLang's scheduler (tp_worker.py): min(context - 1, KV - 1) - 5.
    assert info["max_req_input_len"] == min(info["context_length"] - 1, info["max_total_num_tokens"] - 1) - 5
    assert 1.0 <= info["internal_states"][0]["avg_spec_accept_length"] <= 4.0
    model = httpx.get(base + "/model_info").json()
    assert model["model_path"] == MODEL and model["is_generation"] is True

    answered = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8})
    assert answered.status_code == 200
    loads = httpx.get(base + "/v1/loads").json()
    entry = loads["loads"][0]
    # SGLang's decode step-time moment sums: steps, batch, step us, batch^2, batch x step us, tokens generated.
    steps, batch, step_us, batch_sq, batch_step, generated = entry["decode_moments"]
    assert steps >= 1 and batch >= steps and batch_sq >= batch and step_us > 0 and batch_step >= step_us and generated >= steps
    for key in (
        "num_running_reqs",
        "num_waiting_reqs",
        "token_usage",
        "gen_throughput",
        "max_running_requests",
        "num_used_tokens",
    ):
        assert key in entry
    assert "speculative" in entry and "memory" in entry
    assert entry["disaggregation"]["mode"] == "null" and "decode_moments" in entry and "timestamp" in entry
    core = httpx.get(base + "/v1/loads", params={"include": "core"}).json()["loads"][0]
    assert "speculative" not in core and "memory" not in core
    bad = httpx.get(base + "/v1/loads", params={"include": "nope"})
    assert bad.status_code == 400 and "Invalid include sections" in bad.json()["message"]
    prom = httpx.get(base + "/v1/loads", params={"format": "prometheus"}).text
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in prom


def test_metrics_have_sglang_names_and_extra_labels(client: openai.OpenAI, eagle: SimHandle) -> None:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4)
    text = httpx.get(eagle.url() + "/metrics").text
    for name in (
        "sglang:num_running_reqs{",
        "sglang:num_queue_reqs{",
        "sglang:gen_throughput{",
        "sglang:token_usage{",
        "sglang:spec_accept_length{",
        "sglang:num_aborted_requests_total{",
        "sglang:time_to_first_token_seconds_bucket{",
        "sglang:inter_token_latency_seconds_bucket{",
        "sglang:e2e_request_latency_seconds_bucket{",
        "sglang:prompt_tokens_total{",
        "sglang:generation_tokens_total{",
        "sglang:num_requests_total{",
        "sglang:http_requests_active{",
        "sglang:sim_schedule_slip_seconds_total{",
    ):
        lines = [line for line in text.splitlines() if line.startswith(name)]
        assert lines, name
        assert all('pool="spec"' in line for line in lines), name
    assert 'model_name="specgate-sim/field-8gpu"' in text and 'tp_rank="0"' in text
