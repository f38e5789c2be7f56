"""The simulator's native SGLang routes: `/generate` (single, batched, streamed), tokenize, detokenize."""

from __future__ import annotations

import httpx
import orjson
import pytest

from backends.sim.tokenizer import count_tokens
from backends.testbed import SimHandle


def events(raw: bytes) -> list[bytes]:
    """The `data:` payloads of an SSE body, framing checked."""
    assert raw.endswith(b"\n\n")
    parts = raw[:-2].split(b"\n\n")
    assert all(p.startswith(b"data: ") for p in parts), parts
    return [p[len(b"data: ") :] for p in parts]


def post(sim: SimHandle, body: object, path: str = "/generate", method: str = "POST") -> httpx.Response:
    return httpx.request(method, sim.url() + path, content=orjson.dumps(body), timeout=20)


def test_single_text_runs_to_max_new_tokens(eagle: SimHandle) -> None:
    resp = post(eagle, {"text": "the sea is far", "sampling_params": {"max_new_tokens": 9, "temperature": 0}})
    assert resp.status_code == 200
    out = resp.json()
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 9}
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 9 and meta["cached_tokens"] == 0
    assert len(out["output_ids"]) == 9 and count_tokens(out["text"]) == 9
    assert meta["e2e_latency"] > 0 and meta["id"]
    assert meta["spec_verify_ct"] >= 1 and meta["spec_accept_length"] == 9 / meta["spec_verify_ct"]


def test_put_input_ids_rid_and_default_length(eagle: SimHandle) -> None:
    resp = post(eagle, {"input_ids": [11, 12, 13], "rid": "native-put-1", "sampling_params": {"ignore_eos": True}}, method="PUT")
    meta = resp.json()["meta_info"]
    assert meta["id"] == "native-put-1" and meta["prompt_tokens"] == 3
    assert meta["completion_tokens"] == 128  # SGLang's default max_new_tokens


def test_without_ignore_eos_stops_at_simulated_eos(eagle: SimHandle) -> None:
    meta = post(eagle, {"text": "hi", "sampling_params": {"max_new_tokens": 100000}}).json()["meta_info"]
    assert meta["finish_reason"]["type"] == "stop" and isinstance(meta["finish_reason"]["matched"], int)


def test_stop_string(eagle: SimHandle) -> None:
    first = post(eagle, {"text": "stop test", "sampling_params": {"max_new_tokens": 40}}).json()["text"]
    stop = first.split()[5]
    out = post(eagle, {"text": "stop test", "sampling_params": {"max_new_tokens": 40, "stop": stop}}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == first[: first.index(stop)]  # trimmed before the stop string, as SGLang does


def test_batch_returns_a_list_and_expands_a_rid(eagle: SimHandle) -> None:
    body = {"text": ["one two", "sea"], "rid": "nb", "sampling_params": {"max_new_tokens": 5, "n": 2}}
    outs = post(eagle, body).json()
    assert isinstance(outs, list) and len(outs) == 4
    assert sorted(o["meta_info"]["id"] for o in outs) == ["nb_0", "nb_1", "nb_2", "nb_3"]
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [2, 1, 2, 1]
    assert all(o["meta_info"]["completion_tokens"] == 5 for o in outs)


def test_stream_is_cumulative_and_ends_with_done(eagle: SimHandle) -> None:
    resp = post(eagle, {"text": "go", "stream": True, "sampling_params": {"max_new_tokens": 20}})
    payloads = events(resp.content)
    assert payloads[-1] == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 20 and len(chunks) >= 2
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    assert chunks[-1]["text"].startswith(chunks[0]["text"]) and len(chunks[-1]["output_ids"]) == 20
    assert "index" not in chunks[0]


def test_batched_stream_tags_index(eagle: SimHandle) -> None:
    body = {"input_ids": [[11, 12], [13]], "stream": True, "sampling_params": [{"max_new_tokens": 6}, {"max_new_tokens": 3}]}
    chunks = [orjson.loads(p) for p in events(post(eagle, body).content)[:-1]]
    last = {c["index"]: c["meta_info"] for c in chunks}
    assert last[0]["completion_tokens"] == 6 and last[1]["completion_tokens"] == 3
    assert last[0]["finish_reason"]["type"] == last[1]["finish_reason"]["type"] == "length"


def test_logprobs_shape(eagle: SimHandle) -> None:
    body = {"input_ids": [11, 12, 13], "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 4}}
    meta = post(eagle, body).json()["meta_info"]
    assert [row[1] for row in meta["input_token_logprobs"]] == [11, 12, 13]
    assert meta["input_token_logprobs"][0][0] is None
    assert len(meta["output_token_logprobs"]) == meta["output_token_logprobs_length"] == 4
    assert all(len(row) == 3 and row[2] is None for row in meta["output_token_logprobs"])
    assert len(meta["output_top_logprobs"]) == 4 and len(meta["output_top_logprobs"][0]) == 2
    plain = post(eagle, {"text": "x", "sampling_params": {"max_new_tokens": 2}}).json()["meta_info"]
    assert "output_token_logprobs" not in plain


@pytest.mark.parametrize(
    "body",
    [{"sampling_params": {"max_new_tokens": 3}}, {"input_ids": []}, {"text": "a", "rid": ["x", "y"]}, [1, 2]],
)
def test_errors_have_sglang_native_shape(eagle: SimHandle, body: object) -> None:
    resp = post(eagle, body)
    assert resp.status_code == 400
    assert set(resp.json()) == {"error"} and resp.json()["error"]["message"]


def test_tokenize_and_detokenize_round_trip(eagle: SimHandle) -> None:
    for path in ("/v1/tokenize", "/tokenize"):
        out = post(eagle, {"model": "m", "prompt": "the sea is far"}, path).json()
        assert out["count"] == 4 and len(out["tokens"]) == 4 and out["max_model_len"] > 0
    tokens = post(eagle, {"prompt": ["the sea", "far"]}, "/v1/tokenize").json()["tokens"]
    assert post(eagle, {"tokens": tokens[0]}, "/v1/detokenize").json() == {"text": " the sea"}
    assert post(eagle, {"tokens": tokens}, "/detokenize").json() == {"text": [" the sea", " far"]}
