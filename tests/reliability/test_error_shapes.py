"""In-process checks of the gateway's last-resort error paths (no backend needed).

An unexpected exception still answers OpenAI's error JSON; a body the gateway parsed but cannot
re-encode for the backend (nested deeper than orjson allows, an integer beyond 64 bits) is the
client's 400, not a 500; SGLang's /server_info is relayed without its secrets.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from gateway.api.redact import redact_server_info
from gateway.app import create_app
from gateway.config import BackendConfig, Settings
from gateway.metrics import GatewayMetrics
from gateway.policies.static import ThresholdPolicy
from gateway.pool.backends import Health
from gateway.runtime import Runtime

pytestmark = pytest.mark.reliability

ERROR_KEYS = {"message", "type", "param", "code"}


def _runtime() -> Runtime:
    backends = [
        BackendConfig(name="eagle", url="http://127.0.0.1:9", speculative=True, served_model_name="m"),
        BackendConfig(name="plain", url="http://127.0.0.1:9", speculative=False, served_model_name="m"),
    ]
    settings = Settings.model_validate({"backends": [b.model_dump() for b in backends]})
    return Runtime(settings, backends, ThresholdPolicy(1), GatewayMetrics())


def _client(rt: Runtime) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(rt), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


async def test_an_unexpected_exception_is_an_openai_500(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = _runtime()

    def broken() -> list[str]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(rt, "model_ids", broken)
    async with _client(rt) as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 500
    assert set(resp.json()["error"]) == ERROR_KEYS and resp.json()["error"]["code"] == "internal_error"


@pytest.mark.parametrize(
    "extra",
    [
        b'"x": ' + b"[" * 300 + b"]" * 300,  # parses (Python's json), too deep for orjson to re-encode
        b'"max_tokens": 123456789012345678901234567890',  # valid per the schema, beyond 64 bits
    ],
)
async def test_a_body_that_cannot_be_forwarded_is_a_400(extra: bytes) -> None:
    rt = _runtime()
    for backend in rt.pool:
        backend.health = Health.READY
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], ' + extra + b"}"
    async with _client(rt) as client:
        resp = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) == ERROR_KEYS
    assert rt.pool.total_inflight == 0


async def test_an_unknown_model_error_lists_each_model_once() -> None:
    async with _client(_runtime()) as client:
        resp = await client.post("/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 404
    assert resp.json()["error"]["message"].endswith("available: m")


def test_server_info_loses_every_secret_sglang_puts_in_it() -> None:
    info: dict[str, Any] = {
        "api_key": "k1", "admin_api_key": "k2", "ssl_keyfile_password": None, "port": 30000,
        "launch_command": "python -m sglang.launch_server --api-key k1 --admin-api-key=k2 --ssl-keyfile-password k3 --port 30000",
    }
    out = orjson.loads(redact_server_info(orjson.dumps(info)))
    assert out["api_key"] == out["admin_api_key"] == "<redacted>" and out["ssl_keyfile_password"] is None
    assert not any(k in out["launch_command"] for k in ("k1", "k2", "k3")) and out["port"] == 30000
    assert redact_server_info(b"not json") == b"not json"
