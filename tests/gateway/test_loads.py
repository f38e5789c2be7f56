"""The node's /v1/loads: backends summed into one SGLang-shaped rank, running requests from the gateway."""

from __future__ import annotations

from typing import Any

from gateway.pool.backends import Backend, Pool
from gateway.pool.engine_load import EngineLoad, parse_engine_load
from gateway.pool.node_load import loads_prometheus, node_loads
from tests.gateway.test_edge import assert_openai_error, client_for, make_runtime


def engine(waiting: int, used: int, capacity: int, throughput: float, *, spec: float | None = None) -> EngineLoad:
    """A backend's own /v1/loads (one rank), as SGLang 0.5.23 reports it."""
    rank: dict[str, Any] = {
        "dp_rank": 0,
        "num_running_reqs": 3,
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": 100 * waiting,
        "num_used_tokens": used,
        "num_total_tokens": used,
        "num_active_tokens": used,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": capacity,
        "max_running_requests": 48,
        "token_usage": used / capacity,
        "gen_throughput": throughput,
        "cache_hit_rate": 0.5,
        "utilization": 0.1,
        "total_prefill_uncached_tokens": 1000,
        "total_prefill_busy_us": 2000,
        "memory": {"weight_gb": 8.0, "kv_cache_gb": 30.0, "graph_gb": 1.0, "token_capacity": capacity},
        "disaggregation": {"mode": "null", "prefill_bootstrap_queue_reqs": 0},
        "queues": {"waiting": waiting, "grammar": 0, "paused": 0, "retracted": 1, "prealloc_ready": 0},
    }
    if spec is not None:
        rank["speculative"] = {"accept_length": spec, "accept_rate": (spec - 1) / 3}
    body = {"version": "0.5.23", "accelerator": "NVIDIA H200", "num_accelerators": 4, "loads": [rank]}
    parsed = parse_engine_load(body)
    assert parsed is not None
    return parsed


def node(inflight: dict[str, int]) -> Pool:
    pool = Pool([Backend("eagle", "http://e", True), Backend("plain", "http://p", False)])
    for name, count in inflight.items():
        for _ in range(count):
            pool.acquire(name)
    return pool


def test_backends_sum_into_one_rank_with_the_gateways_own_request_count() -> None:
    pool = node({"eagle": 5, "plain": 4})
    pool["eagle"].engine_load = engine(waiting=1, used=1000, capacity=10_000, throughput=300.0, spec=2.5)
    pool["plain"].engine_load = engine(waiting=2, used=3000, capacity=30_000, throughput=700.0)
    body = node_loads(pool, {"core", "disagg", "queues", "memory"}, None)
    assert body["version"] == "0.5.23" and isinstance(body["timestamp"], str)
    assert body["num_accelerators"] == 8  # two servers, each a group of its own
    (entry,) = body["loads"]
    assert entry["dp_rank"] == 0
    assert (entry["num_running_reqs"], entry["num_waiting_reqs"]) == (6, 3)  # 9 in flight, 3 of them queued
    assert entry["num_waiting_uncached_tokens"] == 300
    assert (entry["num_used_tokens"], entry["max_total_num_tokens"]) == (4000, 40_000)
    assert entry["token_usage"] == 0.1
    assert entry["gen_throughput"] == 1000.0
    assert entry["max_running_requests"] == 96 and entry["utilization"] == round(6 / 96, 4)
    assert entry["memory"] == {"weight_gb": 16.0, "kv_cache_gb": 60.0, "graph_gb": 2.0, "token_capacity": 40_000}
    assert entry["queues"] == {"waiting": 3, "grammar": 0, "paused": 0, "retracted": 2, "prealloc_ready": 0}
    assert entry["disaggregation"]["mode"] == "null"
    assert "speculative" not in entry  # not asked for
    counts = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "max_running_requests")
    assert all(type(entry[key]) is int for key in counts)  # a router parses them as integers


def test_every_section_by_default_and_core_alone_when_asked() -> None:
    pool = node({})
    pool["eagle"].engine_load = engine(waiting=0, used=10, capacity=100, throughput=1.0, spec=3.0)
    (everything,) = node_loads(pool, None, None)["loads"]
    assert {"memory", "speculative", "disaggregation", "queues"} <= set(everything)
    assert everything["speculative"]["accept_length"] == 3.0
    (core,) = node_loads(pool, {"core"}, None)["loads"]
    assert not {"memory", "speculative", "disaggregation", "queues"} & set(core)
    assert node_loads(pool, None, 1)["loads"] == []  # the node is one rank


def test_without_engine_figures_the_counts_are_the_gateways() -> None:
    pool = node({"eagle": 2, "plain": 1})
    body = node_loads(pool, None, None)
    (entry,) = body["loads"]
    assert (entry["num_running_reqs"], entry["num_waiting_reqs"], entry["max_total_num_tokens"]) == (3, 0, 0)
    assert entry["token_usage"] == 0.0 and entry["utilization"] == 0.0
    assert isinstance(body["version"], str)  # never null: a router reads it as a string


def test_a_queue_fed_past_the_gateway_is_reported_and_running_never_negative() -> None:
    pool = node({"plain": 1})
    pool["plain"].engine_load = engine(waiting=5, used=0, capacity=100, throughput=0.0)
    (entry,) = node_loads(pool, None, None)["loads"]
    assert (entry["num_running_reqs"], entry["num_waiting_reqs"]) == (0, 5)


def test_an_answer_that_is_not_a_load_report_is_ignored() -> None:
    assert parse_engine_load({"detail": "Not Found"}) is None
    assert parse_engine_load([1, 2]) is None


def test_prometheus_format_names_gauges_as_sglang_does() -> None:
    pool = node({"eagle": 1})
    pool["eagle"].engine_load = engine(waiting=0, used=10, capacity=100, throughput=5.0, spec=2.0)
    text = loads_prometheus(node_loads(pool, None, None))
    assert 'sglang_num_running_reqs{dp_rank="0"} 1' in text
    assert 'sglang_spec_accept_length{dp_rank="0"} 2.0' in text
    assert 'sglang_disagg_prefill_bootstrap_queue_reqs{dp_rank="0"} 0' in text
    assert "sglang_decode_moments" not in text and "mode" not in text


async def test_the_route_answers_sglangs_shape_and_refuses_unknown_sections_as_openai_errors() -> None:
    rt = make_runtime(security={"api_keys": ["k"]})
    rt.pool.acquire("plain")
    async with await client_for(rt) as client:
        assert_openai_error(await client.get("/v1/loads"), 401)  # as SGLang: the key is needed
        key = {"authorization": "Bearer k"}
        body = (await client.get("/v1/loads", params={"include": "core,disagg,queues,memory"}, headers=key)).json()
        assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
        assert body["loads"][0]["num_running_reqs"] == 1
        bad = await client.get("/v1/loads", params={"include": "core,gpu"}, headers=key)
        assert "gpu" in assert_openai_error(bad, 400, param="include")["message"]
        text = (await client.get("/v1/loads", params={"format": "prometheus"}, headers=key)).text
        assert 'sglang_num_running_reqs{dp_rank="0"} 1' in text


def test_the_policy_sees_each_backends_kv_capacity_as_its_engine_reports_it() -> None:
    pool = node({})
    assert (pool.snapshot().get("eagle").kv_tokens, pool.snapshot().get("eagle").kv_rank_tokens) == (0, 0)
    pool["eagle"].engine_load = engine(waiting=0, used=0, capacity=10_000, throughput=0.0)
    two_ranks = {"loads": [{"dp_rank": 0, "max_total_num_tokens": 6_000}, {"dp_rank": 1, "max_total_num_tokens": 5_000}]}
    pool["plain"].engine_load = parse_engine_load(two_ranks)
    eagle, plain = pool.snapshot().get("eagle"), pool.snapshot().get("plain")
    assert (eagle.kv_tokens, eagle.kv_rank_tokens) == (10_000, 10_000)
    assert (plain.kv_tokens, plain.kv_rank_tokens) == (11_000, 5_000)  # a request runs on one rank


def test_the_policy_sees_each_backends_prefill_counters_summed_over_its_ranks() -> None:
    pool = node({})
    assert (pool.snapshot().get("eagle").prefill_tokens, pool.snapshot().get("eagle").prefill_busy_us) == (0, 0)
    pool["eagle"].engine_load = engine(waiting=0, used=0, capacity=10_000, throughput=0.0)
    two_ranks = {"loads": [
        {"dp_rank": 0, "total_prefill_uncached_tokens": 6_000, "total_prefill_busy_us": 700_000},
        {"dp_rank": 1, "total_prefill_uncached_tokens": 5_000, "total_prefill_busy_us": "?"},  # not a number: 0
    ]}
    pool["plain"].engine_load = parse_engine_load(two_ranks)
    eagle, plain = pool.snapshot().get("eagle"), pool.snapshot().get("plain")
    assert (eagle.prefill_tokens, eagle.prefill_busy_us) == (1_000, 2_000)
    assert (plain.prefill_tokens, plain.prefill_busy_us) == (11_000, 700_000)
