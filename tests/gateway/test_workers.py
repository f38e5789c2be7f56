"""Several workers on one load board route and learn exactly as one process would."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest

from gateway.config import BackendConfig, Settings
from gateway.metrics import GatewayMetrics
from gateway.policies import Completion, Decision, Progress
from gateway.policies.adaptive import AdaptivePolicy
from gateway.pool.backends import Backend, DecodeWindow, Health, Pool
from gateway.pool.board import RING, LoadBoard
from gateway.pool.engine_load import parse_engine_load
from gateway.runtime import Runtime

WORKERS = 3
NAMES = ("eagle", "plain")


_ATTACHED: list[LoadBoard] = []


@pytest.fixture
def board() -> Iterator[LoadBoard]:
    owner = LoadBoard.create(WORKERS, len(NAMES))
    yield owner
    while _ATTACHED:
        _ATTACHED.pop().close()
    owner.close(unlink=True)


def _attach(owner: LoadBoard, worker: int) -> LoadBoard:
    """The board as worker `worker` sees it (a worker process attaches the same way)."""
    _ATTACHED.append(LoadBoard(owner.spec, worker))
    return _ATTACHED[-1]


def _pool(board: LoadBoard | None = None) -> Pool:
    return Pool([Backend(name, f"http://{name}", name == "eagle") for name in NAMES], board)


def test_in_flight_counts_are_the_sums_of_every_worker_and_a_dead_worker_is_cleared(board: LoadBoard) -> None:
    pools = [_pool(_attach(board, w)) for w in range(WORKERS)]
    single = _pool()
    rng = random.Random(7)
    held: list[tuple[int, object, object]] = []
    for step in range(300):
        if held and rng.random() < 0.45:
            worker, slot, twin = held.pop(rng.randrange(len(held)))
            slot.release()  # type: ignore[attr-defined]
            twin.release()  # type: ignore[attr-defined]
        else:
            worker, name = rng.randrange(WORKERS), rng.choice(NAMES)
            held.append((worker, pools[worker].acquire(name, max_tokens=10 + step), single.acquire(name, max_tokens=10 + step)))
        expected = single.snapshot()
        for pool in pools:  # every worker sees the gateway's counts, as the one process does
            assert pool.snapshot() == expected
            assert pool.total_inflight == single.total_inflight
    dead = 1
    survivors = {name: sum(1 for w, s, _ in held if w != dead and s.backend.name == name) for name in NAMES}  # type: ignore[attr-defined]
    board.clear_worker(dead, time.monotonic())
    for pool in (pools[0], pools[2]):
        assert {v.name: v.inflight for v in pool.snapshot().backends} == survivors
    for worker, slot, _ in held:
        if worker != dead:
            slot.release()  # type: ignore[attr-defined]
    assert all(pool.total_inflight == 0 for pool in pools)


def test_a_batch_counts_its_weight_in_every_worker(board: LoadBoard) -> None:
    pools = [_pool(_attach(board, w)) for w in range(WORKERS)]
    slot = pools[0].acquire("plain", max_tokens=8, weight=4, prompt_tokens=100.0)  # a batched /generate of 4 sequences
    for pool in pools:
        view = pool.snapshot().get("plain")
        assert (view.inflight, view.expected_tokens, view.held_prompt_tokens) == (4, 32.0, 400.0)
    slot.release()
    assert all(pool.total_inflight == 0 and pool.snapshot().get("plain").held_prompt_tokens == 0.0 for pool in pools)


def test_the_health_checkers_engine_loads_reach_every_worker(board: LoadBoard) -> None:
    parent, workers = _pool(board), [_pool(_attach(board, w)) for w in range(WORKERS)]
    rank = {"dp_rank": 0, "num_running_reqs": 13, "num_waiting_reqs": 3, "token_usage": 0.97}
    parent["eagle"].engine_load = parse_engine_load({"version": "0.5.23", "num_accelerators": 1, "loads": [rank]})
    parent.publish_loads()
    for pool in workers:
        pool.sync()
        assert pool["eagle"].engine_load == parent["eagle"].engine_load and pool["plain"].engine_load is None
    parent["eagle"].engine_load = None  # the backend left routing
    parent.publish_loads()
    for pool in workers:
        pool.sync()
        assert pool["eagle"].engine_load is None


def test_a_worker_further_behind_than_the_ring_skips_the_oldest_records_in_order(board: LoadBoard) -> None:
    writer, reader = _attach(board, 0), _attach(board, 1)
    assert reader.unread() == []
    records = [(n % 2, n, 0.5, 1.0, 2.0, 2.0, 3, 100, 40, n % 3, 7 * n) for n in range(RING + 10)]  # the ring wraps around
    for record in records:
        writer.publish(record)
    kept = reader.unread()
    # The oldest are gone; the slot the next record will overwrite is not trusted either.
    assert kept == [tuple(float(x) for x in r) for r in records[-(RING - 1) :]]
    assert reader.unread() == []
    writer.publish(records[0])
    assert reader.unread() == [tuple(float(x) for x in records[0])]  # and it carries on from there


def test_the_load_integral_is_the_gateways(board: LoadBoard) -> None:
    pools = [_pool(_attach(board, w)) for w in range(WORKERS)]
    start = time.monotonic()
    slots = [pools[w].acquire("plain") for w in range(WORKERS)]  # three requests, one per worker
    now = time.monotonic()
    area = pools[0]["plain"].load_area(now) - pools[0]["plain"].load_area(start)
    assert area == pytest.approx(WORKERS * (now - start), rel=0.05, abs=1e-4)
    for slot in slots:
        slot.release()


def _runtime(board: LoadBoard | None, group: str | None = None) -> Runtime:
    backends = [BackendConfig(name=name, url=f"http://{name}", speculative=name == "eagle", group=group) for name in NAMES]
    settings = Settings.model_validate({"backends": [b.model_dump() for b in backends]})
    return Runtime(settings, backends, AdaptivePolicy(), GatewayMetrics(), board=board, poll_health=False)


def test_every_worker_learns_every_completion_as_one_process_would(board: LoadBoard) -> None:
    workers = [_runtime(_attach(board, w)) for w in range(WORKERS)]
    single = _runtime(None)
    rng = random.Random(3)
    for i in range(400):
        backend = rng.choice(NAMES)
        n = rng.uniform(1, 40)
        tokens = rng.randint(8, 300)
        tpot = (0.010 if backend == "eagle" else 0.014) + (0.0012 if backend == "eagle" else 0.0003) * n
        given = tokens // 2 if i % 7 == 0 else 0  # a handed-over stream's: EAGLE or plain decoded the rest
        decode = tpot * (tokens - given - 1) * rng.uniform(0.9, 1.1)
        completion = Completion(backend, tokens, 0.05, decode, n, n, max(1, (tokens - given) // 3), given=given)
        single.learn(completion)
        workers[i % WORKERS].learn(completion)  # whichever worker relayed the response
    expected = single.policy.describe()["beliefs"]["backends"]
    for rt in workers:
        rt.catch_up()
        assert rt.policy.describe()["beliefs"]["backends"] == expected  # type: ignore[attr-defined]


def test_every_worker_learns_every_streams_progress_in_order(board: LoadBoard) -> None:
    """Stretches of streams still running travel the ring with the completions, in one order for all."""
    workers = [_runtime(_attach(board, w)) for w in range(WORKERS)]
    single = _runtime(None)
    for rt in (*workers, single):
        rt.policy.routed(rt.pool.snapshot(), Decision("plain", "adaptive_prior"))  # the arms exist
    rng = random.Random(9)
    for i in range(120):
        n = rng.uniform(1, 40)
        window = DecodeWindow(8 * (0.014 + 0.0003 * n), n, n, 8)
        single.progress("plain", window)
        workers[i % WORKERS].progress("plain", window)
        if i % 10 == 0:
            completion = Completion("plain", 65, 0.05, 64 * (0.014 + 0.0003 * n), n, n, 64)
            single.learn(completion)
            workers[i % WORKERS].learn(completion)
    single.catch_up()
    expected = single.policy.describe()["beliefs"]["backends"]["plain"]
    assert expected["observations"] == 120 + 12
    for rt in workers:
        rt.catch_up()
        assert rt.policy.describe()["beliefs"]["backends"]["plain"] == expected  # type: ignore[attr-defined]


def test_completions_and_progress_reach_every_worker_whole(board: LoadBoard) -> None:
    """Every field of what a worker relayed crosses the ring, the prompt tokens sent while it decoded included."""
    workers = [_runtime(_attach(board, w)) for w in range(WORKERS)]
    heard: list[list[object]] = [[] for _ in workers]
    for rt, got in zip(workers, heard, strict=True):
        rt.policy.observe = got.append  # type: ignore[method-assign]
        rt.policy.paced = got.append  # type: ignore[method-assign]
    completion = Completion("eagle", 200, 0.05, 0.9, 3.5, 6.25, 70, 1200, 1024, 33, 4096.0)
    workers[1].progress("plain", DecodeWindow(0.2, 2.0, 4.5, 8, 640.0))
    workers[2].learn(completion)
    for rt in workers:
        rt.catch_up()
    assert heard == [[Progress("plain", 0.2, 8, 2.0, 4.5, 640.0), completion]] * WORKERS


@pytest.mark.parametrize("group", [None, "pair"])
def test_a_worker_that_never_routed_learns_as_the_one_that_did(board: LoadBoard, group: str | None) -> None:
    """It knows each backend's kind and group (so its crossover and a co-located pair's skipped responses
    are the routing process's) and its first routing keeps the fit (no comeback from an outage)."""
    single, router, idle = _runtime(None, group), _runtime(_attach(board, 0), group), _runtime(_attach(board, 1), group)
    for rt in (single, router, idle):
        for backend in rt.pool:
            backend.health = Health.READY
            rt.pool.publish_health(backend)
    for rt in (single, router):
        rt.policy.routed(rt.pool.snapshot(), Decision("eagle", "adaptive_prior"))
    rng = random.Random(5)
    for i in range(200):
        backend, n, tokens = NAMES[i % 2], rng.uniform(1, 30), rng.randint(8, 300)
        tpot = (0.010 if backend == "eagle" else 0.014) + (0.0012 if backend == "eagle" else 0.0003) * n
        others = rng.choice([0.0, 0.0, 3.0])  # co-located: the other server busy for some responses
        completion = Completion(backend, tokens, 0.05, tpot * (tokens - 1), n, n + others, max(1, tokens // 3))
        single.learn(completion)
        router.learn(completion)
    expected = single.policy.describe()["beliefs"]  # type: ignore[attr-defined]
    assert expected["backends"]["eagle"]["speculative"] is True and expected["crossover_concurrency"] > 0
    assert (expected["backends"]["eagle"]["shared_skipped"] > 0) == (group is not None)
    idle.catch_up()
    for rt in (router, idle):
        beliefs = rt.policy.describe()["beliefs"]  # type: ignore[attr-defined]
        assert beliefs["backends"] == expected["backends"]
        assert beliefs["crossover_concurrency"] == expected["crossover_concurrency"]
    idle.policy.routed(idle.pool.snapshot(), Decision("plain", "adaptive_predicted_faster"))
    fits = idle.policy.describe()["beliefs"]["backends"]  # type: ignore[attr-defined]
    keys = ("points", "effective_observations")
    assert [[fits[n][k] for k in keys] for n in NAMES] == [[expected["backends"][n][k] for k in keys] for n in NAMES]


def test_the_priority_lane_is_the_gateways_whichever_worker_saw_the_priority_request(board: LoadBoard) -> None:
    workers = [_runtime(_attach(board, w)) for w in range(WORKERS)]
    lanes = [rt.policy.lane for rt in workers]
    assert all(lane is not None and not lane.active for lane in lanes)
    snapshot = workers[0].pool.snapshot()
    workers[1].policy.routed(snapshot, Decision("eagle", "tier_priority_eagle", "priority"))
    assert all(lane.active for lane in lanes)  # type: ignore[union-attr]
    window = lanes[0].settings.window  # type: ignore[union-attr]
    for i in range(window):  # default decisions, spread over the workers, close it for all of them
        workers[i % WORKERS].policy.routed(snapshot, Decision("plain", "adaptive_predicted_faster"))
    assert [lane.describe()["decisions_since_priority"] for lane in lanes] == [window] * WORKERS  # type: ignore[union-attr]
    assert not any(lane.active for lane in lanes)  # type: ignore[union-attr]


def test_a_worker_that_served_nothing_scrapes_the_health_checkers_latest_states(board: LoadBoard) -> None:
    parent, worker = _runtime(board), _runtime(_attach(board, 1))
    assert b'specgate_backend_up{backend="eagle"} 0.0' in worker.metrics.exposition()
    for backend in parent.pool:
        backend.served_model_name, backend.model_card = backend.name, {"id": backend.name}
    parent.pool.publish_cards()
    for backend in parent.pool:
        backend.health = Health.READY
        parent.pool.publish_health(backend)
    scraped = worker.metrics.exposition()  # no request, no /ready: only the scrape itself reads the board
    assert b'specgate_backend_up{backend="eagle"} 1.0' in scraped and b'specgate_backend_up{backend="plain"} 1.0' in scraped
