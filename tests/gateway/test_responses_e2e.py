"""The Responses API's stored responses through `specgate serve`, in front of two sims with SGLang's
response store on (threshold 2: a lone request goes to eagle): where a follow-up goes, which
backend a response id names after a failover, `store: false`, and ids looked up by a worker, or a
gateway, that never saw them."""

from __future__ import annotations

import asyncio
import signal

import openai
import pytest

from backends.testbed import SimFactory, start_gateway
from gateway.pool.affinity import backend_tag
from tests.reliability.stack import Stack, gateway_env, running_stack, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STORE = ("--enable-response-store",)
THRESHOLD = {"policy": {"name": "threshold", "threshold": 2}}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_a_follow_up_goes_where_its_predecessor_is_stored_not_where_the_policy_would(sims: SimFactory) -> None:
    async with running_stack(sims, time_scale=0.1, gateway=THRESHOLD, sim_args=STORE) as stack:
        api = client(stack.url)
        first = await api.responses.with_raw_response.create(
            model=stack.model, input="Hello.", max_output_tokens=4, extra_headers={"x-specgate-route": "plain"}
        )
        assert first.headers["x-specgate-backend"] == "plain"
        # Alone, the policy would send it to eagle, which never stored the conversation it continues.
        follow = await api.responses.with_raw_response.create(
            model=stack.model, input="And then?", previous_response_id=first.parse().id, max_output_tokens=4
        )
        assert follow.headers["x-specgate-backend"] == "plain"
        assert follow.parse().previous_response_id == first.parse().id
        await api.close()


async def test_a_response_failed_over_is_named_for_the_backend_that_made_it(sims: SimFactory) -> None:
    gateway = {**THRESHOLD, "health": {"ready_interval": 60}}  # routing still sends the next request to eagle
    async with running_stack(sims, time_scale=0.1, gateway=gateway, sim_args=STORE) as stack:
        stack.eagle.signal(signal.SIGKILL)
        await asyncio.to_thread(stack.eagle.wait, 5)
        api = client(stack.url)
        raw = await api.responses.with_raw_response.create(model=stack.model, input="Hi.", max_output_tokens=4)
        response = raw.parse()
        assert raw.headers["x-specgate-backend"] == "plain"  # refused by eagle, failed over before any byte
        assert response.id[len("resp_") :].startswith(backend_tag("plain"))  # minted anew for where it went
        assert (await api.responses.retrieve(response.id)).id == response.id
        await api.close()
        assert await _retrieved_by_a_new_gateway(stack, response.id) == 200  # by the name alone


async def test_a_response_not_stored_is_not_remembered(sims: SimFactory) -> None:
    async with running_stack(sims, time_scale=0.1, gateway=THRESHOLD, sim_args=STORE) as stack:
        api = client(stack.url)
        kept = await api.responses.create(model=stack.model, input="Hi.", max_output_tokens=4, extra_body={"request_id": "resp_kept"})
        await api.responses.create(
            model=stack.model, input="Hi.", max_output_tokens=4, store=False, extra_body={"request_id": "resp_not_kept"}
        )
        assert (await api.responses.retrieve(kept.id)).id == "resp_kept"
        with pytest.raises(openai.NotFoundError) as missing:
            await api.responses.retrieve("resp_not_kept")
        # The gateway's own 404 (no backend has it), not a backend's answer relayed from a remembered home.
        assert missing.value.body["code"] == "response_not_found"  # type: ignore[index]
        await api.close()


async def test_response_ids_are_found_through_every_worker_and_after_a_restart(sims: SimFactory) -> None:
    async with running_stack(sims, time_scale=0.1, gateway=THRESHOLD, sim_args=STORE, workers=2) as stack:
        made = {}  # response id -> the backend that made it
        for n in range(6):
            route = {"x-specgate-route": "plain"} if n % 2 else {}
            given = {"request_id": f"resp_client_{n}"} if n >= 3 else {}  # the client's own id names no backend
            async with _new_client(stack.url) as api:
                raw = await api.responses.with_raw_response.create(
                    model=stack.model, input="Hi.", max_output_tokens=4, extra_headers=route, extra_body=given
                )
                made[raw.parse().id] = raw.headers["x-specgate-backend"]
        for response_id, backend in made.items():
            for _ in range(8):  # each on a new connection: whichever worker accepts it answers
                async with _new_client(stack.url) as api:
                    raw = await api.responses.with_raw_response.retrieve(response_id)
                    assert raw.headers["x-specgate-backend"] == backend and raw.parse().id == response_id
        for response_id in made:
            assert await _retrieved_by_a_new_gateway(stack, response_id) == 200


class _new_client:
    """An openai client whose every request opens a new connection."""

    def __init__(self, url: str) -> None:
        self._api = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, default_headers={"connection": "close"}
        )

    async def __aenter__(self) -> openai.AsyncOpenAI:
        return self._api

    async def __aexit__(self, *exc: object) -> None:
        await self._api.close()


async def _retrieved_by_a_new_gateway(stack: Stack, response_id: str) -> int:
    """The status a second gateway, in front of the same sims and never told of the id, answers for it."""
    backends = [{"name": name, "url": sim.url(), "speculative": name == "eagle"} for name, sim in (("eagle", stack.eagle), ("plain", stack.plain))]
    env = gateway_env(backends, {"server": {"workers": 1}, "health": {"ready_interval": 0.2}})
    fresh = await asyncio.to_thread(start_gateway, env=env)
    try:
        await until(lambda: _health_known(stack, fresh.url), 10, "the new gateway has probed its backends")
        async with stack.session.get(fresh.url + "/v1/responses/" + response_id) as resp:
            return resp.status
    finally:
        await asyncio.to_thread(fresh.stop)


async def _health_known(stack: Stack, url: str) -> bool:
    status = await stack.get_json(url + "/admin/status")
    return all(b["state"] in ("ready", "down") for b in status["backends"])
