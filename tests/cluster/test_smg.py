"""The real SMG router (PyPI `smg`) in front of two `specgate serve` nodes with simulated backends.

SMG runs its load-aware policy (power_of_two, expected wait), which reads each node's /v1/loads:
1. a node whose servers are busy (a queue of long prompts sent to its simulators directly, as
   another tenant would) gets far less of SMG's traffic than round robin's half, and SMG's view
   of it holds the queue it read from the node's /v1/loads;
2. a node killed under load: every request sent after the kill succeeds (SMG retries it on the
   live node) and SMG stops routing to the dead one;
3. the node back on its port gets traffic again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backends.process import Child, free_loopback_port
from backends.testbed import GatewayProcess
from tests.cluster.smg_stack import Traffic, busy, node_config, smg_executable, smg_workers, start_node, start_smg, until

pytestmark = [pytest.mark.smg, pytest.mark.timeout(420)]

BUSY_STREAMS = 4  # per server of the busy node: 1 runs, 3 wait
PROMPT_TOKENS = 4000


@dataclass
class Cluster:
    """SMG at `smg` in front of nodes `a` and `b` (b's servers each run one request at a time)."""

    smg: str
    smg_child: Child
    a: GatewayProcess
    b: GatewayProcess
    b_config: Path
    b_port: int


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    executable = smg_executable()
    if executable is None:
        pytest.skip("no smg: install the pinned `smg` into a venv and point SPECGATE_SMG at its smg (.ci/run does)")
    tmp = tmp_path_factory.mktemp("smg")
    b_port = free_loopback_port()
    b_config = node_config(tmp, "b", max_running=1)
    started: list[GatewayProcess] = []
    child: Child | None = None
    cluster: Cluster | None = None
    try:
        started.append(start_node(node_config(tmp, "a")))
        started.append(start_node(b_config, b_port))
        child, url = start_smg(executable, [node.url for node in started], tmp / "smg.log")
        cluster = Cluster(url, child, started[0], started[1], b_config, b_port)
        yield cluster
    finally:
        if child is not None:
            child.stop_blocking(grace=10)
        restarted = [cluster.b] if cluster is not None and cluster.b is not started[-1] else []
        for node in [*started, *restarted]:
            node.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        yield client


async def traffic_through(cluster: Cluster, http: httpx.AsyncClient) -> Traffic:
    """Wait until SMG has both nodes healthy with a load read from each; a recorder of its traffic."""

    async def ready() -> bool:
        try:
            workers = await smg_workers(http, cluster.smg)
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        nodes = [workers.get(n.url) for n in (cluster.a, cluster.b)]
        return all(w is not None and w["is_healthy"] and w.get("engine_load") for w in nodes)

    await until(ready, "SMG to register both nodes and read their /v1/loads", 90)
    model = (await http.get(f"{cluster.smg}/v1/models")).json()["data"][0]["id"]
    return Traffic(http, cluster.smg, model)


async def test_the_busy_node_gets_less_of_smgs_traffic(cluster: Cluster, http: httpx.AsyncClient) -> None:
    traffic = await traffic_through(cluster, http)
    warm = await traffic.count(concurrency=2, requests=12)
    assert set(warm) == {cluster.a.url, cluster.b.url}, f"both idle nodes serve: {warm}"

    status = (await http.get(f"{cluster.b.url}/admin/status")).json()
    servers = [backend["url"] for backend in status["backends"]]
    stop = asyncio.Event()
    background = asyncio.gather(
        *(busy(http, server, traffic.model, BUSY_STREAMS, PROMPT_TOKENS, stop) for server in servers)
    )
    try:

        async def b_queue_seen_by_smg() -> bool:
            load = (await smg_workers(http, cluster.smg))[cluster.b.url].get("engine_load") or {}
            ranks = load.get("loads") or [{}]
            return ranks[0].get("num_waiting_reqs", 0) >= 4 and ranks[0].get("num_waiting_uncached_tokens", 0) > 0

        await until(b_queue_seen_by_smg, "SMG to read node b's queue from its /v1/loads", 60)
        served = await traffic.count(concurrency=2, requests=40, max_tokens=64)
    finally:
        stop.set()
        await background
    assert None not in served, f"every request succeeds: {[o for o in traffic.outcomes if not o.ok][:3]}"
    total = sum(served.values())
    # Round robin would give each node half; SMG reads b's queue and sends it far less.
    assert served[cluster.b.url] <= 0.25 * total, served
    assert served[cluster.a.url] >= 0.75 * total, served


async def test_a_killed_node_loses_no_new_request_and_gets_traffic_again_when_back(
    cluster: Cluster, http: httpx.AsyncClient
) -> None:
    traffic = await traffic_through(cluster, http)
    killed_at = 0.0
    out_at = 0.0

    async def kill_then_watch() -> None:
        nonlocal killed_at, out_at
        await until(lambda: len(traffic.outcomes) >= 10, "traffic before the kill", 60)
        cluster.b.kill_group()  # SIGKILL node b's gateway and its servers, under load
        killed_at = time.monotonic()

        async def b_out() -> bool:
            return not (await smg_workers(http, cluster.smg))[cluster.b.url]["is_healthy"]

        await until(b_out, "SMG to mark the killed node unhealthy", 30)
        out_at = time.monotonic()
        start = len(traffic.outcomes)
        await until(lambda: len(traffic.outcomes) - start >= 20, "traffic after the kill is seen", 60)

    watcher = asyncio.create_task(kill_then_watch())
    await traffic.loop(concurrency=3, done=watcher.done)
    await watcher

    after_kill = traffic.since(killed_at)
    assert after_kill, "requests were sent after the kill"
    failed = [o for o in after_kill if not o.ok]
    assert not failed, f"{len(failed)} of {len(after_kill)} requests sent after the kill failed: {failed[:3]}"
    after_out = traffic.since(out_at)
    assert {o.node for o in after_out} == {cluster.a.url}, "SMG routes only to the live node once b is out"

    cluster.b = start_node(cluster.b_config, cluster.b_port)  # back on the URL SMG knows
    back_at = time.monotonic()

    async def b_serves() -> bool:
        return (await traffic.one()).node == cluster.b.url

    await until(b_serves, "SMG to route to the returned node", 90)
    assert all(o.ok for o in traffic.since(back_at)), [o for o in traffic.since(back_at) if not o.ok][:3]
