"""A closed loop of streamed chats through a running gateway, with the real `openai` client."""

from __future__ import annotations

import asyncio
from collections import Counter

import openai

from backends.testbed import GatewayProcess


async def closed_loop(
    gateway: GatewayProcess,
    concurrency: int,
    requests: int,
    *,
    max_tokens: int = 96,
    headers: dict[str, str] | None = None,
) -> Counter[str]:
    """`requests` streamed chats from `concurrency` workers; how many each backend served."""
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id
    served: Counter[str] = Counter()
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=max_tokens,
                stream=True,
                extra_headers=headers,
            )
            async for _ in raw.parse():
                pass
            served[raw.headers["x-specgate-backend"]] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return served
