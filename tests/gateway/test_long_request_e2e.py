"""End to end: a request of nearly the model's whole context on a co-located group.

`specgate serve` on one simulated H100 (llama8b-h100: 131,072-token context) with both servers
co-located at the launcher's default split. An even split would leave each server about 113,000
tokens of KV, so SGLang would answer a 120,000-token prompt 400 on both; the default keeps the plain
server's room for one context-length request, and the policy sends the request only to a server
that holds it. Driven with the real `openai` client; the in-flight counts return to zero.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess, gateway_with_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CONFIG = """
[server]
workers = 1

[launch]
engine = "sim"
profile = "llama8b-h100"
topology = "colocated"
time_scale = 0.01
"""
PROMPT_WORDS = 120_000  # one token each (the simulator's tokenizer), plus the chat template's few


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_with_config(CONFIG, tmp_path_factory.mktemp("long")) as gw:
        yield gw


async def test_a_prompt_longer_than_an_even_split_holds_is_served_by_the_plain_server(gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient() as http:
        status = (await http.get(gateway.url + "/admin/status")).json()
        rooms = {b["name"]: (await http.get(b["url"] + "/get_server_info")).json()["max_total_num_tokens"]
                 for b in status["backends"]}
    assert rooms["eagle"] < PROMPT_WORDS < rooms["plain"], rooms

    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "a " * PROMPT_WORDS}], max_tokens=16
    )
    completion = raw.parse()
    assert raw.headers["x-specgate-backend"] == "plain"
    assert completion.usage is not None and completion.usage.prompt_tokens > PROMPT_WORDS
    assert completion.usage.completion_tokens == 16
    # Beyond the model's context: SGLang's 400, relayed as is.
    with pytest.raises(openai.BadRequestError, match="longer than the model's context length"):
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "a " * rooms["plain"]}], max_tokens=16
        )
    await client.close()

    async with httpx.AsyncClient(base_url=gateway.url) as http:
        backends = (await http.get("/admin/status")).json()["backends"]
    assert all(b["inflight"] == 0 for b in backends), backends
