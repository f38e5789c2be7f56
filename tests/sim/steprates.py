"""Steps per second of loaded sims, read from their `/metrics`: how tests tell shared GPUs from separate ones."""

from __future__ import annotations

import asyncio

import httpx


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


async def step_rates(http: httpx.AsyncClient, load: dict[str, tuple[str, int]], window: float) -> dict[str, float]:
    """Steps per second of each loaded role while it holds `load[role] = (url, requests)` long requests.

    The requests are far longer than the window (and all fit the KV cache) and are cancelled (an
    abort) after it, so every step in the window runs the full batch and no client round trip
    leaves a gap; steps keep to absolute deadlines, so a late wake-up moves a step, not the count.
    """

    async def hold(url: str) -> None:
        body = {"model": "m", "prompt": "word " * 16, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        async with http.stream("POST", url + "/v1/completions", json=body) as resp:
            async for _ in resp.aiter_raw():
                pass

    async def counts() -> tuple[float, dict[str, float]]:
        texts = await asyncio.gather(*(http.get(url + "/metrics") for url, _ in load.values()))
        return asyncio.get_running_loop().time(), {
            role: metric_value(t.text, "sglang:sim_steps_total") for role, t in zip(load, texts, strict=True)
        }

    holders = [asyncio.create_task(hold(url)) for url, n in load.values() for _ in range(n)]
    try:
        await asyncio.sleep(0.3)  # everyone joined and past the joining step
        t0, before = await counts()
        await asyncio.sleep(window)
        t1, after = await counts()
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    for url, _ in load.values():  # aborts have emptied the batch before the next measurement
        for _ in range(100):
            if metric_value((await http.get(url + "/metrics")).text, "sglang:num_running_reqs") == 0:
                break
            await asyncio.sleep(0.05)
    return {role: (after[role] - before[role]) / (t1 - t0) for role in load}
