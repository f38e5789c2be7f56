"""Fixtures of the end-to-end gateway tests: a module defines `gateway` (its `specgate serve`), these
give its served model id and an `openai` client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess, start_gateway


def serving(env: dict[str, str]) -> Iterator[GatewayProcess]:
    """`specgate serve` on its embedded default with `env`, stopped when the fixture ends."""
    gw = start_gateway(env=env)
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def model(gateway: GatewayProcess) -> str:
    return httpx.get(gateway.url + "/v1/models").json()["data"][0]["id"]  # type: ignore[no-any-return]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
