"""Security of the running gateway: keys, secrets, where it connects, and size limits.

- With client keys configured, every route but /health and /ready (and /metrics unless
  `metrics_public = false`) needs a valid key; admin routes need the admin key.
- The backends' key and the client and admin keys never appear in the gateway's log, its error
  messages or any response, including SGLang's `/server_info`, which carries them in clear.
- Neither the `model` field, nor any header, nor the request target can make the gateway open a
  connection anywhere but its configured backends.
- The request-body and request-head limits hold, before anything is forwarded.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any, Self

import aiohttp
import orjson
import pytest
from aiohttp import web

from backends.testbed import SimFactory, start_gateway
from gateway.edge.auth import SGLANG_ADMIN_PATHS
from tests.aioserve import serving_app
from tests.reliability.stack import JSON, Stack, gateway_env, running_stack, until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

BACKEND_KEY = "sk-backend-3f1e9a7c"
CLIENT_KEYS = ("sk-client-one-77aa10", "sk-client-two-0b5c22")
ADMIN_KEY = "sk-admin-c4d2e819"
SECRETS = (BACKEND_KEY, *CLIENT_KEYS, ADMIN_KEY)
OPEN_PATHS = {"/health", "/ready"}


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _keyed_gateway(metrics_public: bool) -> dict[str, dict[str, Any]]:
    return {
        "security": {"api_keys": list(CLIENT_KEYS), "admin_api_key": ADMIN_KEY, "metrics_public": metrics_public},
        "server": {"log_level": "debug"},
    }


async def _routes(stack: Stack) -> list[tuple[str, str]]:
    """(method, path) of every route: the OpenAPI schema's, FastAPI's doc pages, and an unknown path."""
    schema = await stack.get_json(stack.url + "/openapi.json", stack.client_headers)
    routes = [(method.upper(), path.replace("{model_id}", stack.model)) for path, ops in schema["paths"].items() for method in ops]
    return routes + [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/docs/oauth2-redirect"), ("GET", "/nope")]


async def _status(stack: Stack, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    body = stack.chat(2, stream=False) if method == "POST" else None
    async with stack.session.request(method, stack.url + path, data=body, headers={**JSON, **headers}) as resp:
        return resp.status, await resp.read()


@pytest.mark.parametrize("metrics_public", [True, False])
async def test_every_route_but_the_probes_needs_a_valid_key(
    sims: SimFactory, metrics_public: bool, record_property: pytest.RecordProperty
) -> None:
    async with running_stack(
        sims, time_scale=0.1, gateway=_keyed_gateway(metrics_public), backend_key=BACKEND_KEY,
        client_key=CLIENT_KEYS[0], admin_key=ADMIN_KEY,
    ) as stack:
        routes = await _routes(stack)
        assert {("POST", "/v1/chat/completions"), ("GET", "/admin/status"), ("GET", "/metrics")} <= set(routes)
        open_paths = OPEN_PATHS | ({"/metrics"} if metrics_public else set())
        wrong = [{}, _bearer("sk-wrong"), {"authorization": f"Basic {CLIENT_KEYS[0]}"}, {"authorization": CLIENT_KEYS[0]},
                 _bearer(CLIENT_KEYS[0] + "x"), _bearer(CLIENT_KEYS[0][:-1])]
        for method, path in routes:
            admin = path.startswith("/admin") or path in SGLANG_ADMIN_PATHS
            valid = _bearer(ADMIN_KEY) if admin else _bearer(CLIENT_KEYS[1])
            for headers in wrong + ([_bearer(CLIENT_KEYS[0])] if admin else []):
                status, body = await _status(stack, method, path, headers)
                if path in open_paths:
                    assert status != 401, (method, path, headers)
                    continue
                assert status == 401, (method, path, headers, status)
                error = orjson.loads(body)["error"]
                assert error["code"] == "invalid_api_key" and set(error) == {"message", "type", "param", "code"}
            status, _ = await _status(stack, method, path, valid)
            assert status not in (401, 403), (method, path, status)
    record_property("routes_checked", len(routes))


async def _fake_sglang_info(key: str) -> web.Application:
    """An SGLang stand-in whose /server_info leaks its keys the way SGLang's does (sglang issue 37457)."""

    async def ready(_: web.Request) -> web.Response:
        return web.Response()

    async def models(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "leaky-model", "object": "model"}]})

    async def server_info(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({
            "model_path": "leaky-model", "api_key": key, "admin_api_key": ADMIN_KEY, "ssl_keyfile_password": None,
            "launch_command": f"python -m sglang.launch_server --api-key {key} --admin-api-key={ADMIN_KEY} --port 1",
            "internal_states": [{"avg_spec_accept_length": 3.0}],
        })

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/health", ready)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/model_info", ready)
    return app


async def test_keys_never_appear_in_logs_errors_or_responses(sims: SimFactory, record_property: pytest.RecordProperty) -> None:
    plain = await asyncio.to_thread(sims.start, "--role", "plain", "--time-scale", "0.1", "--api-key", BACKEND_KEY)
    async with serving_app(await _fake_sglang_info(BACKEND_KEY)) as eagle_url:
        backends = [
            {"name": "eagle", "url": eagle_url, "speculative": True, "api_key": BACKEND_KEY, "served_model_name": "leaky-model"},
            {"name": "plain", "url": plain.url(), "speculative": False, "api_key": BACKEND_KEY},
        ]
        gw = await asyncio.to_thread(start_gateway, env=gateway_env(backends, _keyed_gateway(metrics_public=True)))
        seen: list[tuple[bytes, bytes]] = []
        try:
            async with aiohttp.ClientSession() as session:
                seen += await _exercise(session, gw.url)
        finally:
            await asyncio.to_thread(gw.stop)
    info = orjson.loads(next(body for _, body in seen if b"internal_states" in body))
    assert info["api_key"] == "<redacted>" and info["internal_states"] == [{"avg_spec_accept_length": 3.0}]
    log = gw.text()
    record_property("responses_checked", len(seen))
    record_property("log_lines_checked", len(log.splitlines()))
    assert "backend eagle: starting -> ready" in log  # the debug log was captured
    for secret in SECRETS:
        assert secret not in log, f"a key is in the gateway's log: {secret[:6]}..."
        leaking = [head + body[:200] for head, body in seen if secret.encode() in head + body]
        assert not leaking, f"a key is in a response: {leaking[0]!r}"


async def _exercise(session: aiohttp.ClientSession, url: str) -> list[tuple[bytes, bytes]]:
    """Successes, every kind of refusal and error, and the info routes; every response's headers and body."""
    client, admin = _bearer(CLIENT_KEYS[0]), _bearer(ADMIN_KEY)
    plain = {**client, "x-specgate-route": "plain"}

    async def both_ready() -> bool:
        async with session.get(url + "/admin/status", headers=admin) as resp:
            return all(b["state"] == "ready" for b in (await resp.json())["backends"])

    await until(both_ready, 20, "the gateway sees both backends ready")
    async with session.get(url + "/v1/models", headers=client) as resp:
        model = (await resp.json())["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    calls: list[tuple[str, str, dict[str, str], Any]] = [
        ("POST", "/v1/chat/completions", plain, chat),
        ("POST", "/v1/chat/completions", plain, {**chat, "stream": True}),
        ("POST", "/v1/completions", plain, {"model": model, "prompt": "hi", "max_tokens": 2, "stream": True}),
        ("POST", "/v1/chat/completions", plain, {**chat, "max_tokens": 10**9}),  # refused by the backend
        ("POST", "/v1/chat/completions", plain, {**chat, "model": "nope"}),
        ("POST", "/v1/chat/completions", plain, {**chat, "temperature": 9}),
        ("POST", "/v1/chat/completions", {**client, "x-specgate-route": "eagle"}, chat),  # the stand-in has no chat route
        ("POST", "/v1/chat/completions", _bearer(ADMIN_KEY), chat),  # admin key on a client route
        ("POST", "/v1/chat/completions", _bearer(BACKEND_KEY), chat),  # the backends' key is not a client key
        ("GET", "/admin/status", client, None),
        ("GET", "/admin/status", admin, None),
        ("GET", "/server_info", client, None),
        ("GET", "/model_info", client, None),
        ("GET", "/metrics", {}, None),
        ("GET", "/openapi.json", client, None),
        ("GET", "/health", {}, None),
    ]
    seen = []
    for method, path, headers, body in calls:
        data = orjson.dumps(body) if body is not None else None
        async with session.request(method, url + path, data=data, headers={**JSON, **headers}) as resp:
            head = "\n".join(f"{k}: {v}" for k, v in resp.headers.items()).encode()
            seen.append((head, await resp.read()))
    return seen


class Canary:
    """A TCP listener that records every connection made to it: nothing should ever reach it.

    `others()` is the check: it connects once itself (the positive control) and waits until that
    connection is recorded. The kernel queues completed connections in order and they are accepted
    in order, so any connection made before the control, such as one the gateway opened while
    answering a request that has completed, is recorded by then; no waiting on a guess.
    """

    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self._arrived = asyncio.Condition()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self._arrived:
            self.peers.append(writer.get_extra_info("peername")[:2])
            self._arrived.notify_all()
        writer.close()

    async def others(self, timeout: float = 10.0) -> list[tuple[str, int]]:
        """Every connection recorded before a control connection of our own was (it must be)."""
        host, port = self.address.split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        control = writer.get_extra_info("sockname")[:2]
        try:
            async with self._arrived, asyncio.timeout(timeout):
                await self._arrived.wait_for(lambda: control in self.peers)
        finally:
            writer.close()
        return self.peers[: self.peers.index(control)]


async def _raw(url: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Send `request` as is on a new connection; everything the gateway answers until it closes or times out."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        out = b""
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                out += chunk
                if _complete(out):
                    break
        return out
    finally:
        writer.close()


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


async def test_the_canary_records_a_connection_made_just_before_the_check() -> None:
    async with Canary() as canary:
        host, port = canary.address.split(":")
        _, early = await asyncio.open_connection(host, int(port))  # not yet accepted by the canary
        try:
            elsewhere = await canary.others()
        finally:
            early.close()
    assert elsewhere == [early.get_extra_info("sockname")[:2]]


async def test_no_field_header_or_target_can_send_the_gateway_elsewhere(
    sims: SimFactory, record_property: pytest.RecordProperty
) -> None:
    async with running_stack(sims, time_scale=0.1) as stack, Canary() as canary:
        target = f"http://{canary.address}"
        url = stack.url + "/v1/chat/completions"
        bodies: list[dict[str, Any]] = [
            {"model": model} for model in (target, target + "/v1", canary.address, f"{stack.model}@{canary.address}", "//" + canary.address)
        ] + [{"model": stack.model, field: target} for field in ("base_url", "api_base", "url", "endpoint", "server")]
        headers: list[dict[str, str]] = [
            {name: value}
            for name in ("host", "x-forwarded-host", "x-forwarded-for", "x-real-ip", "x-original-url", "x-rewrite-url",
                         "x-backend-url", "x-upstream", "x-specgate-route", "x-specgate-backend")
            for value in (target, canary.address)
        ] + [{"forwarded": f"host={canary.address};proto=http"}]
        statuses = []
        for body in bodies:
            payload = orjson.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
            async with stack.session.post(url, data=payload, headers=JSON) as resp:
                statuses.append((resp.status, resp.headers.get("x-specgate-backend")))
        for extra in headers:
            async with stack.session.post(url, data=stack.chat(2, stream=False), headers={**JSON, **extra}) as resp:
                statuses.append((resp.status, resp.headers.get("x-specgate-backend")))
        body = stack.chat(2, stream=False)
        raw = [
            b"POST %s/v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (target.encode(), canary.address.encode(), len(body)) + body,
            b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (canary.address.encode(), canary.address.encode()),
            b"GET /v1/models/%s HTTP/1.1\r\nHost: x\r\n\r\n" % target.encode(),
            b"GET //%s/v1/models HTTP/1.1\r\nHost: x\r\n\r\n" % canary.address.encode(),
        ]
        answers = [await _raw(stack.url, request) for request in raw]
        elsewhere = await canary.others()

    record_property("steering_attempts", len(statuses) + len(answers))
    record_property("connections_elsewhere", len(elsewhere))
    assert elsewhere == []
    # Each request was either served by a configured backend or refused; none reached anything else.
    assert all(backend in ("eagle", "plain") if status == 200 else 400 <= status < 500 for status, backend in statuses), statuses
    assert all(answer.startswith(b"HTTP/1.1 ") for answer in answers), answers


async def test_body_and_head_size_limits_hold(sims: SimFactory) -> None:
    max_body, max_head = 64 * 1024, 8 * 1024
    gateway = {"limits": {"max_body_bytes": max_body, "max_header_bytes": max_head}}
    async with running_stack(sims, time_scale=0.1, gateway=gateway) as stack:
        url = stack.url + "/v1/chat/completions"
        before = len(await stack.sim_requests(stack.eagle)) + len(await stack.sim_requests(stack.plain))

        def chat_of(size: int) -> bytes:
            body = stack.chat(1, stream=False)
            padded = body[:-1] + b',"pad":"' + b"x" * (size - len(body) - 9) + b'"}'
            assert len(padded) == size
            return padded

        fits, too_big = chat_of(max_body - 100), chat_of(max_body + 1)
        async with stack.session.post(url, data=fits, headers=JSON) as resp:
            assert resp.status == 200, await resp.text()

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(too_big), 4096):
                yield too_big[start:start + 4096]

        refused = []
        async with stack.session.post(url, data=too_big, headers=JSON) as resp:
            refused.append((resp.status, await resp.read()))
        async with stack.session.post(url, data=chunks(), headers=JSON) as resp:  # chunked: no Content-Length
            refused.append((resp.status, await resp.read()))
        after = len(await stack.sim_requests(stack.eagle)) + len(await stack.sim_requests(stack.plain))

        def head(extra: bytes) -> bytes:
            return b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"

        fits_head = await _raw(stack.url, head(b"X-Pad: " + b"a" * (max_head - 200) + b"\r\n"))
        heads = [
            await _raw(stack.url, head(b"X-Pad: " + b"a" * (max_head + 1) + b"\r\n")),
            await _raw(stack.url, head(b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(max_head // 100)))),
            await _raw(stack.url, b"GET /v1/models?" + b"q" * (max_head + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
        ]
        endless = await _endless_header(stack.url, total=16 * 1024 * 1024)
        healthy = await stack.get_json(stack.url + "/v1/models")
        inflight = await stack.inflight()

    for status, body in refused:
        assert status == 413 and set(orjson.loads(body)["error"]) == {"message", "type", "param", "code"}, (status, body[:200])
    assert after == before + 1  # only the request that fit reached a backend
    assert fits_head.startswith(b"HTTP/1.1 200 ")
    for answer in heads + [endless]:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        error = orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_header_fields_too_large" and set(error) == {"message", "type", "param", "code"}
    assert healthy["data"] and inflight == 0


async def _endless_header(url: str, total: int) -> bytes:
    """Stream one header of `total` bytes; the 431 must come long before it ends (nothing is buffered whole)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    sent = 0
    try:
        await loop.sock_sendall(sock, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        while sent < total:
            try:
                await loop.sock_sendall(sock, b"a" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 65536
        answer = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
    finally:
        sock.close()
    assert sent < total, "the gateway read the whole endless header"
    return answer
