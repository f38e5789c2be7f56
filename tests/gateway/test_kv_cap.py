"""A backend whose KV cache binds takes no more requests than it can run (gateway/engine_load.py).

Co-located servers each hold a share of the group's memory, so with long contexts the EAGLE server
fills its KV cache while its line still predicts it fastest; what it cannot run would only queue.
"""

from __future__ import annotations

from gateway.engine_load import KV_FREE_USAGE, KV_FULL_USAGE, EngineLoad, kv_bound_cap
from gateway.pool import BackendView, PoolSnapshot
from tests.gateway.test_adaptive import LLAMA_EAGLE, LLAMA_PLAIN
from tests.gateway.test_adaptive_groups import trained


def load(running: int, waiting: int, usage: float) -> EngineLoad:
    rank = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting, "token_usage": usage}
    return EngineLoad("0.5.23", "gpu", 1, (rank,))


def test_the_cap_is_what_a_kv_bound_engine_runs_and_holds_until_usage_falls() -> None:
    assert kv_bound_cap(None, load(13, 3, 0.97)) == 13  # queueing with a full cache: bound
    assert kv_bound_cap(None, load(13, 3, 0.5)) is None  # a burst waiting for prefill, not for memory
    assert kv_bound_cap(None, load(13, 0, 0.97)) is None  # full but nothing waits: not bound yet
    # Once bound it stays so while the cache stays nearly full, even with the queue drained...
    assert kv_bound_cap(13, load(12, 0, KV_FULL_USAGE - 0.01)) == 13
    assert kv_bound_cap(13, load(12, 0, KV_FREE_USAGE)) == 13
    # ...and is lifted once usage falls below the lower mark.
    assert kv_bound_cap(13, load(6, 0, KV_FREE_USAGE - 0.01)) is None
    assert kv_bound_cap(13, None) == 13  # no figures this poll: keep what was known
    assert kv_bound_cap(None, load(0, 5, 1.0)) == 1  # never a cap of 0: the queue must drain somewhere


def test_a_kv_bound_eagle_server_sends_the_rest_to_plain() -> None:
    policy = trained(1, LLAMA_EAGLE, LLAMA_PLAIN)  # llama8b-h100: EAGLE predicted faster at any load here
    free = PoolSnapshot((BackendView("g0-eagle", True, True, 13, "g0"), BackendView("g0-plain", False, True, 0, "g0")))
    assert policy.choose(free).backend == "g0-eagle"
    bound = PoolSnapshot(
        (BackendView("g0-eagle", True, True, 13, "g0", kv_cap=13), BackendView("g0-plain", False, True, 0, "g0"))
    )
    decision = policy.choose(bound)
    assert decision.backend == "g0-plain" and decision.reason == "adaptive_cap"
    below = PoolSnapshot(
        (BackendView("g0-eagle", True, True, 12, "g0", kv_cap=13), BackendView("g0-plain", False, True, 3, "g0"))
    )
    assert policy.choose(below).backend == "g0-eagle"  # room again once one of its requests ends
