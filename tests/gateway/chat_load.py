"""A closed loop of chats through a running gateway, with the real `openai` client; the default gateway
the adaptive end-to-end tests run against."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import openai

from backends.testbed import GatewayProcess, start_gateway


def default_gateway() -> Iterator[GatewayProcess]:
    """`specgate serve` on its embedded default (no --policy: adaptive), simulators at time scale 0.5, one
    worker (the policy's beliefs on /admin/status are then the whole gateway's); stopped after."""
    gw = start_gateway(env={"SPECGATE_LAUNCH__TIME_SCALE": "0.5", "SPECGATE_SERVER__WORKERS": "1"})
    try:
        yield gw
    finally:
        gw.stop()


async def closed_loop(
    gateway: GatewayProcess,
    concurrency: int,
    requests: int,
    *,
    max_tokens: int = 96,
    headers: dict[str, str] | None = None,
    stream: bool = True,
) -> Counter[str]:
    """`requests` chats from `concurrency` workers, streamed or answered whole; how many each backend served.
    Each asks for a story of its own (`stream=False`) or the same one."""
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id
    served: Counter[str] = Counter()
    remaining = iter(range(requests))

    async def worker() -> None:
        for i in remaining:
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": "Tell me a story." if stream else f"Tell me story {i}."}],
                max_tokens=max_tokens,
                stream=stream,
                extra_headers=headers,
            )
            if stream:
                async for _ in raw.parse():
                    pass
            else:
                assert raw.parse().usage is not None
            served[raw.headers["x-specgate-backend"]] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return served
