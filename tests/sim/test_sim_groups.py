"""One sim process serving K co-located groups or K replicas, and co-location's memory price over HTTP."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx

from backends.testbed import SimFactory
from tests.sim.steprates import step_rates

REPO_ROOT = Path(__file__).resolve().parents[2]

# Each long request: 1000 prompt tokens and 2000 to generate, so it reserves 3000 tokens of KV.
_LONG = {"model": "m", "prompt": "word " * 1000, "max_tokens": 2000, "ignore_eos": True, "stream": True}


def sim_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backends.sim", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


async def admitted(http: httpx.AsyncClient, url: str, requests: int) -> tuple[int, int]:
    """(running, waiting) of the server at `url` once it holds `requests` long requests and has stepped on."""

    async def hold() -> None:
        async with http.stream("POST", url + "/v1/completions", json=_LONG) as resp:
            async for _ in resp.aiter_raw():
                pass

    holders = [asyncio.create_task(hold()) for _ in range(requests)]
    try:
        for _ in range(400):
            load = (await http.get(url + "/v1/loads")).json()["loads"][0]
            if load["num_running_reqs"] + load["num_waiting_reqs"] == requests:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"{url} never held {requests} requests")
        # The prompt budget admits 16 of these per step; /health answers after the next step ends.
        for _ in range(requests // 16 + 2):
            await http.get(url + "/health")
        load = (await http.get(url + "/v1/loads")).json()["loads"][0]
        return load["num_running_reqs"], load["num_waiting_reqs"]
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)


async def test_a_colocated_server_runs_fewer_long_requests_than_a_lone_one(sims: SimFactory) -> None:
    # Running caps above the 60 requests, so only KV room limits what runs.
    group = sims.start("--colocated", "--profile", "llama8b-h100", "--eagle-max-running-requests", "128")
    lone = sims.start("--role", "eagle", "--profile", "llama8b-h100", "--max-running-requests", "128").url()
    async with httpx.AsyncClient(timeout=30) as http:
        info = (await http.get(group.url("eagle") + "/server_info")).json()
        capacity = info["max_total_tokens"]
        assert capacity == info["sim"]["memory"]["max_total_tokens"] < 385000
        assert (await http.get(lone + "/server_info")).json()["max_total_tokens"] == 385000
        # 60 requests of 3000 tokens: the lone server's KV holds them all, the co-located one's does not.
        fit = capacity // 3000
        assert fit < 60
        assert await admitted(http, group.url("eagle"), 60) == (fit, 60 - fit)
        assert await admitted(http, lone, 60) == (60, 0)


async def test_k_groups_from_one_process_have_separate_gpus(sims: SimFactory) -> None:
    sim = sims.start(
        "--colocated", *("--eagle-port", "0") * 2, *("--plain-port", "0") * 2, "--enable-metrics"
    )
    assert len(sim.group_ports) == 2 and len({p for g in sim.group_ports for p in g.values()}) == 4
    g0_eagle, g1_plain = sim.group_url(0, "eagle"), sim.group_url(1, "plain")
    async with httpx.AsyncClient(timeout=30) as http:
        infos = [(await http.get(sim.group_url(g, "plain") + "/server_info")).json() for g in (0, 1)]
        assert [i["sim"]["group"] for i in infos] == [0, 1]
        rates = await step_rates(http, {"g0-eagle": (g0_eagle, 1), "g1-plain": (g1_plain, 64)}, 1.0)
    # field-8gpu: eagle at 1 request steps in 14 ms, plain at 64 in 87 ms. On separate timelines the
    # eagle server steps about 6 times as often; sharing one GPU they would take turns (ratio 1).
    assert rates["g0-eagle"] > 2.5 * rates["g1-plain"]


async def test_replicas_from_one_process_have_separate_gpus(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain", "--port", "0", "--port", "0", "--time-scale", "2", "--enable-metrics")
    assert len(sim.group_ports) == 2
    async with httpx.AsyncClient(timeout=30) as http:
        rates = await step_rates(http, {"r0": (sim.group_url(0), 1), "r1": (sim.group_url(1), 64)}, 1.5)
    # 1 request steps in 5.8 ms, 64 in 87 ms: alone each, the light replica steps 15 times as often.
    assert rates["r0"] > 4 * rates["r1"]


def test_a_group_that_does_not_fit_is_refused_at_start() -> None:
    result = sim_cli(
        "--colocated", "--eagle-port", "0", "--plain-port", "0", "--gpus-per-group", "4",
        "--eagle-mem-fraction", "0.3", "--plain-mem-fraction", "0.5",
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot start: a group of 4 GPUs does not fit" in result.stderr
    assert "a node of 8 GPUs can hold 1 such group of 8 GPUs" in result.stderr

