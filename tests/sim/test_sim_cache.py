"""The prefix cache over HTTP: what SGLang reports of it (usage, meta_info, metrics, loads) and `/flush_cache`."""

from __future__ import annotations

import threading
import uuid

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from backends.testbed import SimFactory, SimHandle

from .test_sim_native import events


@pytest.fixture(scope="module")
def plain(module_sims: SimFactory) -> SimHandle:
    """A plain sim reporting cached tokens, 10x fast, with metrics."""
    return module_sims.start("--role", "plain", "--time-scale", "0.1", "--enable-cache-report", "--enable-metrics")


def fresh(words: int) -> str:
    """A prompt of `words` one-token words that no other prompt starts with."""
    return f"id{uuid.uuid4().hex[:2]} " + " ".join(["the sea is far"] * (words // 4))


def generate(sim: SimHandle, body: dict[str, object]) -> httpx.Response:
    return httpx.post(sim.url() + "/generate", content=orjson.dumps(body), timeout=20)


def test_the_second_turn_of_a_chat_reports_the_first_turn_as_cached(plain: SimHandle) -> None:
    client = openai.OpenAI(base_url=plain.url() + "/v1", api_key="unused", max_retries=0, timeout=20)
    turn1: list[ChatCompletionMessageParam] = [{"role": "user", "content": fresh(400)}]
    first = client.chat.completions.create(model="m", messages=turn1, max_tokens=20)
    assert first.usage is not None
    answer = first.choices[0].message.content
    turn2: list[ChatCompletionMessageParam] = [
        *turn1,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "and the land"},
    ]
    stream = client.chat.completions.create(
        model="m", messages=turn2, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    details = usage.prompt_tokens_details
    # With the cache report a cold prompt's count is there too, as 0 (SGLang's UsageProcessor).
    assert first.usage.prompt_tokens_details is not None and first.usage.prompt_tokens_details.cached_tokens == 0
    # Turn 1's prompt and all of its answer but the last token, whose KV the model never wrote.
    assert details is not None and details.cached_tokens == first.usage.prompt_tokens + 20 - 1
    assert usage.prompt_tokens == first.usage.prompt_tokens + 20 + 4 + 4 + 3  # answer, two headers, "and the land"


def test_generate_reports_cached_tokens_streamed_and_not(plain: SimHandle) -> None:
    text = fresh(200)
    cold = generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 3}}).json()["meta_info"]
    assert cold["cached_tokens"] == 0 and cold["prompt_tokens"] == 201
    warm = generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 3}}).json()["meta_info"]
    assert warm["cached_tokens"] == 200  # all but the last prompt token
    streamed = generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 6}, "stream": True})
    metas = [orjson.loads(e)["meta_info"] for e in events(streamed.content)[:-1]]
    assert metas and all(m["cached_tokens"] == 200 for m in metas)
    ids = generate(plain, {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 2}}).json()
    again = generate(plain, {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 2}}).json()
    assert ids["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] == 4


def test_flush_is_refused_while_a_request_runs_then_empties_the_cache(plain: SimHandle) -> None:
    text = fresh(100)
    generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 2}})
    endless = {"text": "go", "rid": "long-one", "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}}
    long = threading.Thread(target=generate, args=(plain, endless))
    long.start()
    try:
        while not httpx.get(plain.url() + "/v1/loads", timeout=10).json()["loads"][0]["num_running_reqs"]:
            pass
        busy = httpx.post(plain.url() + "/flush_cache", timeout=10)
        assert busy.status_code == 400 and busy.text == "Flush cache failed.\n"
        waited = httpx.post(plain.url() + "/flush_cache", params={"timeout": 0.2}, timeout=10)
        assert waited.status_code == 400  # still running when the timeout passed
    finally:
        httpx.post(plain.url() + "/abort_request", json={"rid": "long-one"}, timeout=10)
        long.join(10)
    flushed = httpx.get(plain.url() + "/flush_cache", params={"timeout": 5}, timeout=10)
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    meta = generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 2}}).json()["meta_info"]
    assert meta["cached_tokens"] == 0


def test_metrics_and_loads_count_cached_tokens(plain: SimHandle) -> None:
    def scrape() -> dict[str, float]:
        """Each `sglang:` metric summed over its series (`is_streaming` true and false)."""
        values: dict[str, float] = {}
        for line in httpx.get(plain.url() + "/metrics", timeout=10).text.splitlines():
            if line.startswith("sglang:"):
                name = line.split("{")[0]
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return values

    def load() -> dict[str, float]:
        return httpx.get(plain.url() + "/v1/loads", timeout=10).json()["loads"][0]  # type: ignore[no-any-return]

    text = fresh(300)
    generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 2}})
    before, load_before = scrape(), load()
    generate(plain, {"text": text, "sampling_params": {"max_new_tokens": 2}})
    after, load_after = scrape(), load()
    assert after["sglang:cached_tokens_total"] - before["sglang:cached_tokens_total"] == 300
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == 301  # the whole prompt
    assert load_after["total_prefill_uncached_tokens"] - load_before["total_prefill_uncached_tokens"] == 1
    # The request's two tokens came in one prefill step and one decode step: no decode log has zeroed the rate.
    assert after["sglang:cache_hit_rate"] == pytest.approx(300 / 301)
    assert load_after["cache_hit_rate"] == round(300 / 301, 4)
    assert after["sglang:kv_evictable_tokens"] >= 302 and load_after["num_waiting_uncached_tokens"] == 0


def test_without_cache_report_chat_usage_has_no_details_but_responses_do(eagle: SimHandle) -> None:
    content = fresh(100)
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    for _ in range(2):
        usage = httpx.post(eagle.url() + "/v1/chat/completions", json=body, timeout=20).json()["usage"]
        assert usage["prompt_tokens_details"] is None
    created = httpx.post(eagle.url() + "/v1/responses", json={"input": content, "max_output_tokens": 2}, timeout=20)
    usage = created.json()["usage"]
    # The same templated prompt, all but its last token; an EAGLE server's bigram keys reuse one less.
    assert usage["input_tokens_details"] == {"cached_tokens": usage["input_tokens"] - 2, "cache_write_tokens": 0}


def test_disable_radix_cache_turns_it_off(module_sims: SimFactory) -> None:
    sim = module_sims.start("--role", "plain", "--time-scale", "0.1", "--enable-cache-report", "--disable-radix-cache")
    text = fresh(50)
    for _ in range(2):
        meta = generate(sim, {"text": text, "sampling_params": {"max_new_tokens": 2}}).json()["meta_info"]
        assert meta["cached_tokens"] == 0
    info = httpx.get(sim.url() + "/server_info", timeout=10).json()
    assert info["disable_radix_cache"] is True and info["enable_cache_report"] is True
