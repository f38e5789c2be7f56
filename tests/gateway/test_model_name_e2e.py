"""`server.model_name`: the model id clients use, whatever the backends call it, on every API."""

from __future__ import annotations

import ollama
import openai
import pytest

from backends.testbed import SimFactory
from tests.reliability.stack import running_stack

pytestmark = pytest.mark.timeout(120)

PUBLIC = "acme/public-model"


async def test_the_public_model_name_is_listed_and_served_on_every_api(sims: SimFactory) -> None:
    async with running_stack(sims, time_scale=0.1, gateway={"server": {"model_name": PUBLIC}}) as stack:
        served = (await stack.status())["eagle"]["served_model_name"]
        assert served != PUBLIC
        api = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in (await api.models.list()).data] == [PUBLIC]
        assert (await api.models.retrieve(PUBLIC)).id == PUBLIC
        for model in (PUBLIC, served):  # the backends' own name keeps working
            reply = await api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            assert reply.usage is not None and reply.usage.completion_tokens == 3
        with pytest.raises(openai.NotFoundError) as unknown:
            await api.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert PUBLIC in unknown.value.body["message"]  # type: ignore[index]
        await api.close()

        client = ollama.AsyncClient(host=stack.url)
        listed = (await client.list()).models
        assert [(m.model, getattr(m, "name", m.model)) for m in listed] == [(PUBLIC, PUBLIC)]  # renamed from the backend's
        reply = await client.chat(model=PUBLIC, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 3})
        assert reply.done and reply.eval_count == 3
