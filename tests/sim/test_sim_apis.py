"""The simulator's Responses API, Ollama routes, n-choice chat, continued answers and chat tokenize, in SGLang 0.5.23's shapes."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from backends.sim.chat_extras import example_of
from backends.testbed import SimFactory, SimHandle

MODEL = "specgate-sim/field-8gpu"


@pytest.fixture(scope="module")
def stored(module_sims: SimFactory) -> SimHandle:
    """A sim with SGLang's response store on, 10x fast."""
    return module_sims.start("--role", "plain", "--time-scale", "0.1", "--enable-response-store")


def wait_for_status(url: str, response_id: str, statuses: set[str], timeout: float = 20.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(f"{url}/v1/responses/{response_id}").json()
        if body["status"] in statuses or time.monotonic() > deadline:
            return body  # type: ignore[no-any-return]
        time.sleep(0.05)


def test_without_the_store_retrieval_is_refused_as_sglang_does(eagle: SimHandle) -> None:
    created = httpx.post(eagle.url() + "/v1/responses", json={"input": "hi", "max_output_tokens": 2}).json()
    assert created["status"] == "incomplete" and created["usage"]["output_tokens"] == 2
    resp = httpx.get(f"{eagle.url()}/v1/responses/{created['id']}")
    assert resp.status_code == 400 and "Response store is disabled" in resp.json()["error"]["message"]


def test_stored_response_is_retrieved_and_continued(stored: SimHandle) -> None:
    first = httpx.post(stored.url() + "/v1/responses", json={"input": "hi there", "max_output_tokens": 3}).json()
    assert httpx.get(f"{stored.url()}/v1/responses/{first['id']}").json() == first
    follow = httpx.post(
        stored.url() + "/v1/responses", json={"input": "more", "previous_response_id": first["id"], "max_output_tokens": 3}
    ).json()
    # The follow-up's prompt holds the first exchange too.
    assert follow["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    missing = httpx.get(stored.url() + "/v1/responses/resp_missing")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "response_id"


def test_background_response_runs_to_its_end_or_is_cancelled(stored: SimHandle) -> None:
    url = stored.url()
    queued = httpx.post(url + "/v1/responses", json={"input": "go", "max_output_tokens": 4, "background": True}).json()
    assert queued["status"] == "queued" and queued["output"] == []
    assert wait_for_status(url, queued["id"], {"incomplete"})["usage"]["output_tokens"] == 4  # type: ignore[index]

    long = httpx.post(url + "/v1/responses", json={"input": "go", "max_output_tokens": 50000, "background": True}).json()
    cancelled = httpx.post(f"{url}/v1/responses/{long['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert httpx.get(f"{url}/v1/responses/{long['id']}").json()["status"] == "cancelled"


def test_streamed_choices_interleave_with_their_index_and_usage_sums(eagle: SimHandle) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "n": 2,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = httpx.post(eagle.url() + "/v1/chat/completions", json=body, timeout=20).content
    events = [e[len(b"data: ") :] for e in raw[:-2].split(b"\n\n")]
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def _chat(sim: SimHandle, messages: list[dict[str, str]], max_tokens: int, **extra: object) -> dict[str, object]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra}
    resp = httpx.post(sim.url() + "/v1/chat/completions", json=body, timeout=20)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def test_continue_final_message_continues_the_answer_it_was_given(eagle: SimHandle) -> None:
    asked = [{"role": "user", "content": "tell me a story"}]
    whole = _chat(eagle, asked, 8)
    text = whole["choices"][0]["message"]["content"]  # type: ignore[index]
    words = text.split(" ")[1:]  # every output token is one word after a space
    given = "".join(" " + w for w in words[:3])
    rest = _chat(eagle, asked + [{"role": "assistant", "content": given}], 5, continue_final_message=True)
    # The given text follows the prompt as tokens of its own, and a greedy model goes on from it.
    assert rest["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + 3  # type: ignore[index]
    assert given + rest["choices"][0]["message"]["content"] == text  # type: ignore[index]
    # Text the model would not have written is continued too, from a place of its own.
    other = _chat(eagle, asked + [{"role": "assistant", "content": " not mine"}], 4, continue_final_message=True)
    assert other["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + 2  # type: ignore[index]
    assert other["choices"][0]["message"]["content"] != text[: len(other["choices"][0]["message"]["content"])]  # type: ignore[index]


def test_a_last_assistant_message_is_rendered_as_a_user_one_without_continue(eagle: SimHandle) -> None:
    said = [{"role": "user", "content": "the fourth moon"}]
    as_assistant = _chat(eagle, [*said, {"role": "assistant", "content": "of a far planet"}], 4, rid="as-assistant")
    as_user = _chat(eagle, [*said, {"role": "user", "content": "of a far planet"}], 4, rid="as-user")
    assert as_assistant["usage"] == as_user["usage"]
    # The same tokens: the second finds the first's prompt in the prefix cache up to the reply's header.
    (entry,) = httpx.get(eagle.url() + "/_test/requests", params={"rid": "as-user"}).json()
    assert entry["cached_tokens"] >= as_user["usage"]["prompt_tokens"] - 3  # type: ignore[index]


def test_tokenize_counts_what_a_request_would_be_charged(eagle: SimHandle) -> None:
    url = eagle.url()
    asked = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]
    charged = _chat(eagle, asked, 2)["usage"]["prompt_tokens"]  # type: ignore[index]
    told = httpx.post(url + "/v1/tokenize", json={"messages": asked}).json()
    assert told["count"] == charged == len(told["tokens"]) and told["max_model_len"] > charged
    given = [*asked, {"role": "assistant", "content": " once upon"}]
    continued = httpx.post(url + "/v1/tokenize", json={"messages": given, "continue_final_message": True}).json()
    assert continued["count"] == charged + 2 and continued["tokens"][:charged] == told["tokens"]
    completion = httpx.post(url + "/v1/completions", json={"prompt": "one two three", "max_tokens": 1}).json()
    prompts = httpx.post(url + "/tokenize", json={"prompt": ["one two three", "four"]}).json()
    assert prompts["count"] == [completion["usage"]["prompt_tokens"], 1]
    for body in ({}, {"prompt": "a", "messages": asked}):
        refused = httpx.post(url + "/v1/tokenize", json=body)
        assert refused.status_code == 400 and "Exactly one of 'prompt' or 'messages'" in refused.json()["message"]


def test_ollama_stream_ends_with_sglangs_empty_done_line(eagle: SimHandle) -> None:
    body = {"model": "anything", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 6}}
    resp = httpx.post(eagle.url() + "/api/chat", json=body, timeout=20)
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    lines = [orjson.loads(x) for x in resp.content.splitlines()]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop" and lines[-1]["message"]["content"] == ""
    assert all(not x["done"] and x["model"] == MODEL for x in lines[:-1])
    assert "eval_count" not in lines[-1]  # SGLang's streamed answer carries no counts


def test_ollama_generate_with_an_empty_prompt_answers_at_once(eagle: SimHandle) -> None:
    reply = httpx.post(eagle.url() + "/api/generate", json={"model": "m", "prompt": " ", "stream": False}).json()
    assert reply["done"] and reply["response"] == "" and reply["eval_count"] is None


def test_ollama_bad_options_are_a_400(eagle: SimHandle) -> None:
    body = {"model": "m", "prompt": "hi", "options": {"num_predict": -3}}
    assert httpx.post(eagle.url() + "/api/generate", json=body).status_code == 400


def test_schema_examples_match_their_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b"]},
            "n": {"type": ["integer", "null"]},
            "xs": {"type": "array", "items": {"type": "number"}, "minItems": 2},
            "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        },
    }
    assert example_of(schema) == {"kind": "a", "n": 1, "xs": [1.5, 1.5], "inner": {"ok": True}, "either": "sim"}
