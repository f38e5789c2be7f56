"""The prefix map (gateway/pool/prefix.py): which backends hold which prompt blocks, and what the gateway
learns from the cached tokens the backends report."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess
from gateway.dialects.native import NATIVE
from gateway.dialects.ollama import OLLAMA
from gateway.dialects.openai import OPENAI, messages_text
from gateway.pool.board import LoadBoard, LocalBoard
from gateway.pool.prefix import BLOCK_BYTES, PrefixEstimate, PrefixTable, block_keys
from tests.gateway.conftest import serving
from tests.gateway.test_e2e_faults import SOON, eventually


def table(slots: int = 1024) -> PrefixTable:
    return PrefixTable(memoryview(bytearray(PrefixTable.size(slots))), slots)


def test_equal_prefixes_share_their_block_keys_and_a_partial_block_is_not_keyed() -> None:
    base = b"s" * (3 * BLOCK_BYTES)
    one, two = block_keys(base + b"a" * BLOCK_BYTES), block_keys(base + b"b" * BLOCK_BYTES + b"tail")
    assert len(one) == len(two) == 4  # "tail" is less than a block
    assert one[:3] == two[:3] and one[3] != two[3]
    assert block_keys(b"x" * (BLOCK_BYTES - 1)) == []
    assert block_keys(b"t" + base)[0] != block_keys(base)[0]  # a block's key depends on everything before it


def two_prompts() -> tuple[list[int], list[int], int]:
    """Two prompts' block keys after one system prompt, and how many blocks they share."""
    shared = b"system " * 200
    first = block_keys(shared + b"question one " * 60)
    second = block_keys(shared + b"question two " * 60)
    return first, second, sum(a == b for a, b in zip(first, second, strict=False))


def test_a_backend_holds_the_blocks_sent_to_it_up_to_where_its_chain_breaks() -> None:
    t = table()
    first, second, common = two_prompts()
    assert 0 < common < len(first)
    t.insert(first, 0, now=1.0)
    t.insert(second, 2, now=2.0)
    assert t.match(first, 3) == [len(first), 0, common]
    assert t.match(second, 3) == [common, 0, len(second)]
    assert t.match(block_keys(b"unrelated " * 100), 3) == [0, 0, 0]
    assert t.occupied() == len(first) + len(second) - common


def test_the_map_says_when_a_prefix_was_last_sent() -> None:
    t = table()
    first, second, common = two_prompts()
    t.insert(first, 0, now=1.0)
    t.insert(second, 2, now=2.5)
    assert t.sent_at(first, len(first)) == 1.0
    assert t.sent_at(first, common) == 2.5  # the shared blocks went out again with the second prompt
    assert t.sent_at(first, 0) is None and t.sent_at(block_keys(b"unrelated " * 100), 1) is None


def test_a_full_window_gives_its_least_recently_used_slot_to_a_new_block() -> None:
    t = table(slots=8)  # one probe window: every key lands in it
    keys = [block_keys(bytes([i]) * BLOCK_BYTES)[0] for i in range(9)]
    for i, key in enumerate(keys[:8]):
        t.insert([key], 0, now=float(i))
    t.insert([keys[0]], 1, now=10.0)  # the oldest is used again: keys[1] is now the least recent
    t.insert([keys[8]], 0, now=11.0)
    assert t.match([keys[1]], 2) == [0, 0]
    assert t.match([keys[8]], 2) == [1, 0] and t.match([keys[0]], 2) == [1, 1]
    assert t.occupied() == 8


def test_workers_share_one_map() -> None:
    owner = LoadBoard.create(2, 2)
    views = [LoadBoard(owner.spec, w) for w in range(2)]
    try:
        keys = block_keys(b"conversation " * 100)
        views[0].prefix.insert(keys, 1, now=1.0)
        assert views[1].prefix.match(keys, 2) == [0, len(keys)]
        assert LocalBoard().prefix.match(keys, 2) == [0, 0]  # one process's map is its own
    finally:
        for view in views:
            view.close()
        owner.close(unlink=True)


def test_a_conversations_next_turn_extends_its_last_turns_key() -> None:
    turn = [{"role": "system", "content": "be brief " * 50}, {"role": "user", "content": "hi " * 100}]
    later = [*turn, {"role": "assistant", "content": "hello " * 80}, {"role": "user", "content": "more"}]
    first, second = OPENAI.prompt_text({"messages": turn}), OPENAI.prompt_text({"messages": later})
    assert first is not None and second is not None and second.startswith(first)
    assert OLLAMA.prompt_text({"messages": later}) == second
    parts = [{"role": "user", "content": [{"type": "text", "text": "look"}]}]
    assert OPENAI.prompt_text({"messages": parts}) == OPENAI.prompt_text({"messages": parts})
    assert OPENAI.prompt_text({"prompt": "plain text"}) == b"plain text"
    assert OPENAI.prompt_text({"prompt": ["a", "batch"]}) is None
    assert NATIVE.prompt_text({"text": "x"}) == b"x" and NATIVE.prompt_text({"text": ["a", "b"]}) is None
    assert NATIVE.prompt_text({"input_ids": [1, 2]}) == NATIVE.prompt_text({"input_ids": [1, 2]})


def test_the_estimate_learns_tokens_per_byte_and_how_far_each_backend_keeps_what_it_was_sent() -> None:
    estimate = PrefixEstimate(2)
    for _ in range(200):
        estimate.learn(0, size=1000, prompt_tokens=200, predicted=300.0, reported=300)  # kept it all
        estimate.learn(1, size=1000, prompt_tokens=200, predicted=300.0, reported=60)  # evicted most
    assert estimate.tokens_per_byte == pytest.approx(0.2, rel=0.01)
    assert estimate.trust[0] == pytest.approx(1.0) and estimate.trust[1] == pytest.approx(0.2, rel=0.05)
    assert estimate.cached_tokens(1, 4) == pytest.approx(0.2 * BLOCK_BYTES * 4 * estimate.trust[1])
    estimate.learn(0, size=1000, prompt_tokens=200, predicted=300.0, reported=None)  # no report: no evidence
    assert estimate.trust[0] == pytest.approx(1.0)


def test_the_most_tokens_a_prompt_may_hold_follow_the_spread_long_prompts_have_shown() -> None:
    estimate = PrefixEstimate(1)
    assert estimate.most_tokens(4000) == pytest.approx(2 * estimate.prompt_tokens(4000))  # before any response
    for _ in range(300):  # even traffic: the spread fades towards 1
        estimate.learn(0, size=4000, prompt_tokens=1000, predicted=0.0, reported=None)
    assert estimate.tokens_per_byte == pytest.approx(0.25) and estimate.spread == pytest.approx(1.0, abs=0.01)
    estimate.learn(0, size=4000, prompt_tokens=2000, predicted=0.0, reported=None)  # one prompt at twice the rate
    assert estimate.spread == pytest.approx(2.0, rel=0.01)
    assert estimate.most_tokens(4000) >= 1.9 * estimate.prompt_tokens(4000)
    for _ in range(20):  # short prompts, whose chat template inflates their rate, teach no spread
        estimate.learn(0, size=40, prompt_tokens=30, predicted=0.0, reported=None)
    assert estimate.spread == pytest.approx(2.0, rel=0.01)


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    report = '["--enable-cache-report"]'
    env = {
        "SPECGATE_LAUNCH__TIME_SCALE": "0.05",
        "SPECGATE_POLICY__NAME": "threshold",
        "SPECGATE_SERVER__WORKERS": "2",
        "SPECGATE_LAUNCH__EAGLE__EXTRA_ARGS": report,
        "SPECGATE_LAUNCH__PLAIN__EXTRA_ARGS": report,
    }
    yield from serving(env)


def test_a_conversation_on_one_backend_is_predicted_and_reported_cached(gateway: GatewayProcess) -> None:
    """Two workers, turns forced to one backend: the second turn's prediction (whichever worker routed the
    first) and the backend's report both cover the first turn, in the metrics and /admin/status."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": "You are a careful assistant. " * 80}, {"role": "user", "content": "Hi."}]
    for _ in range(3):
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=16, extra_headers={"x-specgate-route": "plain"}  # type: ignore[arg-type]
        )
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}, {"role": "user", "content": "More."}]
    details = reply.usage.prompt_tokens_details if reply.usage is not None else None
    assert details is not None and details.cached_tokens is not None and details.cached_tokens > 400
    prefix = httpx.get(gateway.url + "/admin/status").json()["prefix"]
    plain = prefix["backends"]["plain"]
    assert plain["cached_tokens"] > 800 and plain["predicted_tokens"] > 800  # turns 2 and 3, about the system prompt each
    assert prefix["occupied_slots"] > 0 and 0.3 < plain["hit_rate"] < 1.0
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'specgate_prefix_hit_tokens_total{backend="plain"}' in metrics
    assert 'specgate_prefix_predicted_tokens_total{backend="plain"}' in metrics


def test_content_nested_deeper_than_json_can_be_written_gets_no_key() -> None:
    deep: object = 1
    for _ in range(254):
        deep = {"a": deep}
    assert messages_text([{"role": "user", "content": [deep]}]) is None
    shallow = messages_text([{"role": "user", "content": [{"a": 1}]}])
    assert shallow is not None and b'"a":1' in shallow


def test_admin_status_shows_the_kv_an_in_flight_request_holds(gateway: GatewayProcess) -> None:
    """Two workers: while a stream runs on the plain server, /admin/status (from either worker) counts its
    prompt and expected output against that server's KV capacity; both return to zero when it ends."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    words = 3000
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "kv " * words}], max_tokens=20_000, stream=True,
        extra_headers={"x-specgate-route": "plain"},  # type: ignore[arg-type]
    )
    with stream:
        next(iter(stream))
        kv = {b["name"]: b["kv"] for b in httpx.get(gateway.url + "/admin/status").json()["backends"]}
    assert kv["plain"]["held_prompt_tokens"] > words / 2 and kv["plain"]["expected_output_tokens"] > 0
    assert kv["plain"]["capacity_tokens"] > kv["plain"]["held_prompt_tokens"] + words
    assert kv["eagle"]["held_prompt_tokens"] == 0

    def released() -> bool:  # the stream's slot goes once its worker sees the client gone
        kvs = [b["kv"] for b in httpx.get(gateway.url + "/admin/status").json()["backends"]]
        return all(k["held_prompt_tokens"] == 0 and k["expected_output_tokens"] == 0 for k in kvs)

    eventually(released, SOON, "the closed stream's KV released")
    assert released()  # and again, from whichever worker answers
