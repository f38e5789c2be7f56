"""A gateway in front of two simulated backends, driven with aiohttp from async tests.

    async with running_stack(sims, time_scale=1.0, gateway={"health": {"ready_interval": 0.5}}) as stack:
        outcome = await exchange(stack.session, stack.url + "/v1/chat/completions", stack.chat(8, stream=True))

The gateway is configured through its `SPECGATE_...` environment variables (nested sections as JSON),
the sims run with their test-only routes. Everything started is stopped on exit, also on failure.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from backends.testbed import GatewayProcess, SimFactory, SimHandle, start_gateway
from loadtest.sse import SSEDecoder

T = TypeVar("T")
SIM_ARGS = ("--enable-test-endpoints", "--enable-metrics")
JSON = {"content-type": "application/json"}


async def until(condition: Callable[[], Awaitable[T]], within: float, what: str, every: float = 0.02) -> T:
    """Poll the async `condition` until it returns something truthy; fail naming `what` after `within` s."""
    deadline = time.monotonic() + within
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(every)


@dataclass
class Outcome:
    """Everything a client saw of one request (times are time.monotonic())."""

    sent_at: float
    status: int | None = None
    backend: str | None = None
    headers_at: float | None = None
    ended_at: float | None = None
    events: int = 0
    done: bool = False  # saw `data: [DONE]`
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: dict[str, Any] | None = None  # the OpenAI error object (error body or in-stream error event)
    events_after_error: list[bytes] = field(default_factory=list)
    transport_error: str | None = None  # the connection failed: neither a response nor an error
    retry_after: str | None = None  # the Retry-After header, when the response had one

    @property
    def completed(self) -> bool:
        """A full answer: 200, a finish reason, no error (and [DONE] for a stream)."""
        return self.status == 200 and self.error is None and self.finish_reason is not None and self.transport_error is None

    @property
    def clean_error(self) -> bool:
        """An error the client can act on: an OpenAI error body, or an error event then `data: [DONE]` and nothing else."""
        if self.error is None or self.transport_error is not None:
            return False
        if self.status != 200:
            return set(self.error) == {"message", "type", "param", "code"}
        return self.done and self.events_after_error == [b"[DONE]"]

    @property
    def lost(self) -> bool:
        """Neither a full response nor a clean error."""
        return not (self.completed or self.clean_error)


async def exchange(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Outcome:
    """POST `body` and read the whole response, streamed or not; never raises for request failures."""
    out = Outcome(sent_at=time.monotonic())
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, data=body, headers={**JSON, **(headers or {})}) as resp:
                out.headers_at = time.monotonic()
                out.status = resp.status
                out.backend = resp.headers.get("x-specgate-backend")
                out.retry_after = resp.headers.get("Retry-After")
                if resp.content_type == "text/event-stream":
                    await _read_events(resp, out)
                else:
                    _read_body(orjson.loads(await resp.read()), out)
    except TimeoutError:
        out.transport_error = "timeout"
    except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        out.transport_error = f"{type(exc).__name__}: {exc}"
    out.ended_at = time.monotonic()
    return out


async def _read_events(resp: aiohttp.ClientResponse, out: Outcome) -> None:
    decoder = SSEDecoder()
    async for line in resp.content:
        data = decoder.feed(line)
        if data is None:
            continue
        out.events += 1
        if out.error is not None:
            out.events_after_error.append(data)
        if data == b"[DONE]":
            out.done = True
            continue
        if out.error is not None:
            continue
        chunk = orjson.loads(data)
        if "error" in chunk:
            out.error = chunk["error"]
            continue
        for choice in chunk.get("choices") or ():
            out.finish_reason = choice.get("finish_reason") or out.finish_reason
        if chunk.get("usage"):
            out.completion_tokens = chunk["usage"].get("completion_tokens")
    if not out.done and out.error is None:
        out.transport_error = "stream ended without data: [DONE]"
        out.finish_reason = None


def _read_body(body: Any, out: Outcome) -> None:
    if out.status != 200:
        out.error = body.get("error") if isinstance(body, dict) else None
        if out.error is None:
            out.transport_error = f"error body not in OpenAI's shape: {body!r:.200}"
        return
    out.finish_reason = body["choices"][0]["finish_reason"]
    out.completion_tokens = (body.get("usage") or {}).get("completion_tokens")


@dataclass
class Stack:
    """Two sims, a gateway in front of them, and one client session for both."""

    sims: SimFactory
    eagle: SimHandle
    plain: SimHandle
    gw: GatewayProcess
    session: aiohttp.ClientSession
    sim_args: tuple[str, ...] = ()
    model: str = ""
    client_headers: dict[str, str] = field(default_factory=dict)  # Authorization, when client keys are set
    admin_headers: dict[str, str] = field(default_factory=dict)
    sim_headers: dict[str, str] = field(default_factory=dict)  # the backends' own key, for their test routes

    @property
    def url(self) -> str:
        return self.gw.url

    def sim(self, backend: str) -> SimHandle:
        """The sim behind backend `backend`."""
        return self.eagle if backend == "eagle" else self.plain

    async def restart(self, backend: str) -> SimHandle:
        """Start a new sim on the port of `backend`'s (dead) one; returns once its /ready answers 200."""
        port = self.sim(backend).ports[backend]
        sim = await asyncio.to_thread(self.sims.start, "--role", backend, *self.sim_args, "--port", str(port))
        if backend == "eagle":
            self.eagle = sim
        else:
            self.plain = sim
        return sim

    def chat(self, max_tokens: int, *, stream: bool, **extra: Any) -> bytes:
        """A chat request body of exactly `max_tokens` output tokens."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": max_tokens,
                "ignore_eos": True, "stream": stream, **extra}
        return orjson.dumps(body)

    async def get_json(self, url: str, headers: dict[str, str] | None = None) -> Any:
        async with self.session.get(url, headers=headers) as resp:
            return orjson.loads(await resp.read())

    async def status(self) -> dict[str, dict[str, Any]]:
        """The gateway's view of each backend, by name (GET /admin/status)."""
        body = await self.get_json(self.url + "/admin/status", self.admin_headers)
        return {b["name"]: b for b in body["backends"]}

    async def inflight(self) -> int:
        """Requests the gateway holds a slot for, over all backends."""
        return sum(b["inflight"] for b in (await self.status()).values())

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of GET /metrics, keyed by (name, sorted labels)."""
        async with self.session.get(self.url + "/metrics", headers=self.client_headers) as resp:
            text = await resp.text()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    async def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
        wanted = set(labels.items())
        return sum(v for (n, lbl), v in (await self.metrics()).items() if n == name and wanted <= set(lbl))

    async def sim_requests(self, sim: SimHandle, rid: str | None = None) -> list[dict[str, Any]]:
        """The sim's record of its recent requests (GET /_test/requests)."""
        params = {"rid": rid} if rid is not None else {}
        async with self.session.get(sim.url() + "/_test/requests", params=params, headers=self.sim_headers) as resp:
            return orjson.loads(await resp.read())  # type: ignore[no-any-return]

    async def fault(self, sim: SimHandle, **spec: Any) -> None:
        """Switch a sim fault on (POST /_test/fault)."""
        async with self.session.post(sim.url() + "/_test/fault", data=orjson.dumps(spec), headers={**JSON, **self.sim_headers}) as resp:
            assert resp.status == 200, await resp.text()


def gateway_env(backends: list[dict[str, Any]], sections: dict[str, dict[str, Any]]) -> dict[str, str]:
    """`SPECGATE_...` variables for the backends and config sections given."""
    env = {"SPECGATE_BACKENDS": orjson.dumps(backends).decode()}
    for section, values in sections.items():
        for key, value in values.items():
            env[f"SPECGATE_{section.upper()}__{key.upper()}"] = value if isinstance(value, str) else orjson.dumps(value).decode()
    return env


@asynccontextmanager
async def running_stack(
    sims: SimFactory,
    *,
    time_scale: float,
    gateway: dict[str, dict[str, Any]] | None = None,
    backend_key: str | None = None,
    client_key: str | None = None,
    admin_key: str | None = None,
    connections: int = 1024,
    nofile: tuple[int, int] | None = None,
    workers: int = 1,
    sim_args: tuple[str, ...] = (),
) -> AsyncIterator[Stack]:
    """Start an eagle and a plain sim and a gateway pointed at them; stop all three on exit.

    `backend_key` is the sims' `--api-key` (and the gateway's key for them); `client_key` and
    `admin_key` are what the stack's own helper calls send when the gateway requires keys; `nofile`
    (soft, hard) is the gateway's open-file limit; `workers` its `server.workers` (one unless the
    test is about workers); `sim_args` more of the sims' options.
    """
    gateway = {**(gateway or {}), "server": {"workers": workers, **(gateway or {}).get("server", {})}}
    args = (*SIM_ARGS, "--time-scale", str(time_scale), *(("--api-key", backend_key) if backend_key else ()), *sim_args)
    eagle = await asyncio.to_thread(sims.start, "--role", "eagle", *args)
    plain = await asyncio.to_thread(sims.start, "--role", "plain", *args)
    backends = [
        {"name": name, "url": sim.url(), "speculative": name == "eagle", **({"api_key": backend_key} if backend_key else {})}
        for name, sim in (("eagle", eagle), ("plain", plain))
    ]
    gw = await asyncio.to_thread(start_gateway, env=gateway_env(backends, gateway or {}), nofile=nofile)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections), timeout=aiohttp.ClientTimeout(total=120), read_bufsize=1 << 20
    )
    try:
        stack = Stack(sims, eagle, plain, gw, session, sim_args=args, client_headers=_bearer(client_key),
                      admin_headers=_bearer(admin_key or client_key), sim_headers=_bearer(backend_key))
        await until(lambda: _both_ready(stack), 20, "the gateway sees both backends ready")
        stack.model = (await stack.get_json(stack.url + "/v1/models", stack.client_headers))["data"][0]["id"]
        yield stack
    finally:
        await session.close()
        await asyncio.to_thread(gw.stop)


def _bearer(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


async def _both_ready(stack: Stack) -> bool:
    try:
        return all(b["state"] == "ready" for b in (await stack.status()).values())
    except (aiohttp.ClientError, KeyError):
        return False


async def closed_loop(
    stack: Stack,
    concurrency: int,
    body: Callable[[int], bytes],
    stop: asyncio.Event,
    outcomes: list[Outcome],
    headers: dict[str, str] | None = None,
) -> None:
    """`concurrency` workers each send `body(i)` back to back until `stop` is set, appending to `outcomes`."""
    url = stack.url + "/v1/chat/completions"
    counter = itertools.count()

    async def worker() -> None:
        while not stop.is_set():
            outcomes.append(await exchange(stack.session, url, body(next(counter)), headers))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
