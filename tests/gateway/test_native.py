"""The native `/generate` contract as the gateway reads it: weights, limits, token counts, rids; and
weighted in-flight slots in the pool."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dialects.native import MAX_WEIGHT, NATIVE, NativeChunkReader, NativeInputError, RelayedError, parse_native
from gateway.pool.affinity import RidTable
from gateway.pool.backends import Backend, Pool


@pytest.mark.parametrize(
    ("body", "weight", "batched"),
    [
        ({"text": "hi"}, 1, False),
        ({"input_ids": [1, 2, 3]}, 1, False),
        ({"text": ["a", "b", "c"]}, 3, True),
        ({"input_ids": [[1], [2, 3]]}, 2, True),
        ({"text": "hi", "sampling_params": {"n": 4}}, 4, True),
        ({"text": ["a", "b"], "sampling_params": [{"n": 3}, {"n": 3}]}, 6, True),
    ],
)
def test_weight_is_prompts_times_n(body: dict[str, Any], weight: int, batched: bool) -> None:
    native = parse_native(body)
    assert native.weight == weight and native.batched is batched


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"sampling_params": {}},
        {"input_ids": []},
        {"input_ids": [[1], "x"]},
        {"input_ids": [1, True]},
        {"text": []},
        {"text": "a", "stream": "yes"},
        {"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 2}]},
        {"text": ["a", "b"], "sampling_params": [{}]},
        {"text": "a", "sampling_params": {"n": 0}},
        {"text": "a", "rid": 5},
        {"text": ["a"] * (MAX_WEIGHT + 1)},
    ],
)
def test_bodies_sglang_refuses_are_refused(body: Any) -> None:
    with pytest.raises(NativeInputError):
        parse_native(body)


def test_rids_and_stream() -> None:
    assert parse_native({"text": "a", "rid": "r1", "stream": True}).rids == ("r1",)
    assert parse_native({"text": ["a", "b"], "rid": ["x", "y"]}).rids == ("x", "y")
    assert parse_native({"text": "a"}).rids == () and not parse_native({"text": "a"}).stream
    assert parse_native({"text": "a"}).upstream_rids("g") == ("g",)
    assert parse_native({"text": ["a", "b"], "sampling_params": {"n": 2}}).upstream_rids("g") == ("g_0", "g_1", "g_2", "g_3")
    assert parse_native({"text": ["a", "b"], "rid": ["x", "y"]}).upstream_rids("g") == ("x", "y")
    assert parse_native({"text": "a", "rid": "r", "sampling_params": {"n": 2}}).upstream_rids("g") == ("r_0", "r_1")


def test_max_tokens_and_upstream_body() -> None:
    assert NATIVE.max_tokens({"sampling_params": {"max_new_tokens": 40}}) == 40
    assert NATIVE.max_tokens({"sampling_params": [{"max_new_tokens": 5}, {"max_new_tokens": 9}]}) == 9
    assert NATIVE.max_tokens({"sampling_params": [{"max_new_tokens": 5}, {}]}) is None
    assert NATIVE.max_tokens({"text": "a"}) is None
    kw: dict[str, Any] = {"served_model": "m", "stream": True, "client_wants_usage": True, "request_id": "g1"}
    assert NATIVE.upstream_body({"text": "a"}, **kw) == {"text": "a", "rid": "g1"}  # no model, no stream_options
    assert NATIVE.upstream_body({"text": "a", "rid": "mine"}, **kw) == {"text": "a", "rid": "mine"}


def test_usage_sums_a_batch() -> None:
    one = {"text": "x", "meta_info": {"prompt_tokens": 3, "completion_tokens": 7, "cached_tokens": 2}}
    cached = {"prompt_tokens_details": {"cached_tokens": 2}}
    assert NATIVE.usage(one) == {"prompt_tokens": 3, "completion_tokens": 7, **cached}
    assert NATIVE.usage([one, one]) == {"prompt_tokens": 6, "completion_tokens": 14, "prompt_tokens_details": {"cached_tokens": 4}}
    with pytest.raises(ValueError):
        NATIVE.usage({"text": "no meta"})


def test_stream_reader_counts_new_tokens_per_sequence() -> None:
    read = NativeChunkReader()

    def event(completion: int, index: int | None = None) -> dict[str, Any]:
        meta = {"prompt_tokens": 2, "completion_tokens": completion, "cached_tokens": 1}
        chunk: dict[str, Any] = {"text": "t", "meta_info": meta}
        if index is not None:
            chunk["index"] = index
        return chunk

    def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": cached}}

    assert read(event(1, 0)) == (usage(2, 1, 1), True)
    assert read(event(3, 1)) == (usage(4, 4, 2), True)
    assert read(event(3, 1)) == (usage(4, 4, 2), False)  # nothing new
    assert read(event(5, 0)) == (usage(4, 8, 2), True)
    assert read({"error": {"message": "x"}}) == (None, False)


def test_upstream_json_error_is_relayed_verbatim() -> None:
    payload = b'{"error": {"message": "Either text, input_ids or input_embeds should be provided."}}'
    err = NATIVE.upstream_error(400, payload)
    assert isinstance(err, RelayedError) and err.status == 400 and err.body() == payload
    assert NATIVE.upstream_error(502, b"<html>").body().startswith(b'{"error"')  # not JSON: the gateway's shape


def test_rid_table_follows_the_request_and_forgets_it() -> None:
    table = RidTable()
    where = {"now": "eagle"}

    def locate() -> str | None:
        return where["now"]

    table.add(("a", "b"), locate)
    assert table.backend_of("a") == "eagle"
    where["now"] = "plain"  # failover moved it
    assert table.backend_of("b") == "plain"
    table.discard(("a", "b"), lambda: None)  # another request's discard leaves it alone
    assert len(table) == 2
    table.discard(("a", "b"), locate)
    assert table.backend_of("a") is None and len(table) == 0


def test_weighted_slot_counts_its_weight_until_released() -> None:
    pool = Pool([Backend("eagle", "http://e", True), Backend("plain", "http://p", False)])
    slot = pool.acquire("eagle", max_tokens=10, weight=4)
    assert pool["eagle"].inflight == 4 and pool["eagle"].expected_tokens == 40
    slot.move_to("plain")
    assert pool["eagle"].inflight == 0 and pool["plain"].inflight == 4 and pool["plain"].expected_tokens == 40
    slot.release()
    slot.release()
    assert pool.total_inflight == 0 and pool["plain"].expected_tokens == 0
    assert pool.snapshot().total_inflight == 0
