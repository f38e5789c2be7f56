"""Service tiers end to end: the `openai` SDK's `service_tier` and the header, through `specgate serve`.

One gateway (two simulated field-8gpu backends at time-scale 0.1, the threshold policy, whose
routing is exact: priority to EAGLE, flex to plain) serves the module.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess
from tests.gateway.conftest import serving

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    env = {"SPECGATE_LAUNCH__TIME_SCALE": "0.1", "SPECGATE_POLICY__NAME": "threshold", "SPECGATE_POLICY__THRESHOLD": "1"}
    yield from serving(env)


MESSAGES = [{"role": "user", "content": "Say something."}]


def test_priority_is_echoed_and_served_on_eagle(client: openai.OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=8, service_tier="priority"  # type: ignore[arg-type]
    )
    assert raw.headers["x-specgate-service-tier"] == "priority"
    assert raw.headers["x-specgate-backend"] == "eagle"
    completion = raw.parse()
    assert completion.service_tier == "priority"
    assert completion.choices[0].message.content


def test_flex_stream_echoes_the_tier_in_every_chunk(client: openai.OpenAI, model: str) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, max_tokens=8, stream=True, service_tier="flex"
    ) as raw:
        assert raw.headers["x-specgate-backend"] == "plain"
        assert raw.headers["x-specgate-service-tier"] == "flex"
        chunks = list(raw.parse())
    assert chunks and all(c.service_tier == "flex" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


def test_completions_auto_is_served_as_default(client: openai.OpenAI, model: str) -> None:
    raw = client.completions.with_raw_response.create(
        model=model, prompt="Once", max_tokens=4, extra_body={"service_tier": "auto"}
    )
    assert raw.headers["x-specgate-service-tier"] == "default"
    assert raw.parse().model_extra["service_tier"] == "default"  # type: ignore[index]


def test_the_header_does_what_the_field_does(client: openai.OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=4, extra_headers={"X-Specgate-Service-Tier": "priority"}
    )
    assert raw.headers["x-specgate-backend"] == "eagle"
    assert raw.parse().service_tier == "priority"


def test_untiered_requests_get_no_field_but_the_header_says_default(client: openai.OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=4)
    assert raw.headers["x-specgate-service-tier"] == "default"
    assert raw.parse().service_tier is None


def test_an_unknown_tier_is_refused(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, extra_headers={"X-Specgate-Service-Tier": "gold"})
    assert caught.value.body["param"] == "x-specgate-service-tier"  # type: ignore[index]


def test_metrics_and_status_carry_the_tier(client: openai.OpenAI, model: str, gateway: GatewayProcess) -> None:
    client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, stream=True, service_tier="priority").close()
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, stream=True, service_tier="priority")
    assert len(list(stream)) >= 2
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'specgate_tier_requests_total{status="200",tier="priority"}' in metrics
    tpot = re.search(r'specgate_tier_time_per_output_token_seconds_count\{tier="priority"\} (\S+)', metrics)
    assert tpot is not None and float(tpot[1]) >= 1
    assert 'reason="priority:tier_priority_eagle"' in metrics
    tiers = httpx.get(gateway.url + "/admin/status").json()["tiers"]
    assert tiers["lane"]["priority_lane_active"] is True and tiers["lane"]["decisions_since_priority"] == 0
    assert tiers["flex_inflight_share"] == 0.75 and tiers["sglang_priority"] is False


def test_the_responses_api_is_served_by_tier(client: openai.OpenAI, model: str, gateway: GatewayProcess) -> None:
    raw = client.responses.with_raw_response.create(model=model, input="Say something.", max_output_tokens=8, service_tier="priority")
    assert raw.headers["x-specgate-service-tier"] == "priority" and raw.headers["x-specgate-backend"] == "eagle"
    assert raw.parse().output_text
    with client.responses.with_streaming_response.create(
        model=model, input="Say something.", max_output_tokens=8, stream=True, service_tier="flex"
    ) as streamed:
        assert streamed.headers["x-specgate-service-tier"] == "flex" and streamed.headers["x-specgate-backend"] == "plain"
        assert list(streamed.parse())[-1].type == "response.incomplete"  # ended by max_output_tokens
    metrics = httpx.get(gateway.url + "/metrics").text
    assert re.search(r'specgate_tier_requests_total\{status="200",tier="flex"\} [1-9]', metrics)
