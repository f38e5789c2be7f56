"""End to end against simulated backends with faults: disconnects, a killed backend, draining, a hang,
and responses cut, stalled or garbled mid-body (the simulator's own faults).

Each test gets fresh sims (10x time-scale, test-only routes on) and a one-worker gateway pointed at
them (`specgate serve`, so streams go through its HTTP protocol's body writer, as in production).
Waiting is done by polling a condition with a deadline, never by sleeping a guessed time: the
deadlines are generous (10 s) since a poll that succeeds returns at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from backends.testbed import GatewayProcess, SimFactory, SimHandle, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SIM_ARGS = ("--time-scale", "0.1", "--enable-test-endpoints", "--enable-metrics")
SOON = 10.0  # seconds a polled condition may take on a busy machine


def eventually(condition: Callable[[], Any], within: float, what: str) -> Any:
    """Poll `condition` until truthy; fail with `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.02)


class Rig:
    """Two sims and a gateway in front of them (one worker unless `sections` has a `server` table)."""

    def __init__(self, sims: SimFactory, tmp_path: Path, **sections: str) -> None:
        sections.setdefault("server", "workers = 1")
        self.eagle = sims.start("--role", "eagle", *SIM_ARGS)
        self.plain = sims.start("--role", "plain", *SIM_ARGS)
        toml = "\n".join(f"[{name}]\n{body}" for name, body in sections.items())
        toml += "".join(
            f'\n[[backends]]\nname = "{name}"\nurl = "{sim.url()}"\nspeculative = {str(name == "eagle").lower()}\n'
            for name, sim in (("eagle", self.eagle), ("plain", self.plain))
        )
        config = tmp_path / "gateway.toml"
        config.write_text(toml)
        self.gw: GatewayProcess = start_gateway(config=config)
        eventually(lambda: httpx.get(self.gw.url + "/ready").status_code == 200, SOON, "gateway ready")
        self.model = httpx.get(self.gw.url + "/v1/models").json()["data"][0]["id"]
        self.client = openai.OpenAI(base_url=self.gw.url + "/v1", api_key="x", max_retries=0)

    def status(self) -> dict[str, Any]:
        return {b["name"]: b for b in httpx.get(self.gw.url + "/admin/status").json()["backends"]}

    def inflight(self) -> int:
        return sum(b["inflight"] for b in self.status().values())

    def sim_request(self, sim: SimHandle, rid: str) -> dict[str, Any] | None:
        found = httpx.get(sim.url() + "/_test/requests", params={"rid": rid}).json()
        return found[0] if found else None

    def fault(self, sim: SimHandle, **spec: Any) -> None:
        httpx.post(sim.url() + "/_test/fault", json=spec).raise_for_status()

    def chat(self, max_tokens: int = 4, **kw: Any) -> Any:
        return self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "user", "content": "hello there"}], max_tokens=max_tokens, **kw
        )


@pytest.fixture
def rig(sims: SimFactory, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(sims, tmp_path, health="ready_interval = 0.2", timeouts="first_byte = 2.0\nidle = 2.0")
    try:
        yield r
    finally:
        r.gw.stop()


def test_client_dropping_a_stream_after_the_first_chunk_aborts_upstream(rig: Rig) -> None:
    raw = rig.chat(max_tokens=5000, stream=True)
    rid = raw.headers["x-request-id"]
    backend = rig.eagle if raw.headers["x-specgate-backend"] == "eagle" else rig.plain
    stream = raw.parse()
    next(iter(stream))
    assert rig.sim_request(backend, rid)["state"] == "running"  # type: ignore[index]
    stream.close()
    eventually(lambda: rig.inflight() == 0, SOON, "gateway in-flight back to 0")
    eventually(lambda: rig.sim_request(backend, rid)["state"] == "aborted", SOON, "sim aborted the request")  # type: ignore[index]
    metrics = httpx.get(rig.gw.url + "/metrics").text
    name = raw.headers["x-specgate-backend"]
    assert f'specgate_requests_total{{backend="{name}",endpoint="chat",status="499"}} 1.0' in metrics


def test_client_leaving_before_the_first_token_aborts_upstream(rig: Rig) -> None:
    rig.fault(rig.eagle, kind="slow_first_token", seconds=30)
    impatient = rig.client.with_options(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(
            model=rig.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=50,
            stream=True,
            extra_body={"rid": "early-leaver"},
            extra_headers={"x-specgate-route": "eagle"},
        )
    eventually(lambda: rig.inflight() == 0, SOON, "gateway in-flight back to 0")
    eventually(lambda: (rig.sim_request(rig.eagle, "early-leaver") or {}).get("state") == "aborted", SOON, "sim aborted it")


def test_non_streaming_client_leaving_aborts_upstream(rig: Rig) -> None:
    impatient = rig.client.with_options(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(
            model=rig.model, messages=[{"role": "user", "content": "hi"}], max_tokens=5000, extra_body={"rid": "gone"}
        )
    eventually(lambda: rig.inflight() == 0, SOON, "gateway in-flight back to 0")
    eventually(lambda: (rig.sim_request(rig.eagle, "gone") or {}).get("state") == "aborted", SOON, "sim aborted it")


def test_killed_backend_is_routed_around_and_no_request_fails(rig: Rig) -> None:
    assert rig.chat().headers["x-specgate-backend"] == "eagle"  # a lone request goes to eagle
    rig.eagle.signal(signal.SIGKILL)
    rig.eagle.wait(5)
    backends = [rig.chat().headers["x-specgate-backend"] for _ in range(5)]
    assert backends == ["plain"] * 5  # the first is retried on plain after the refused connect
    assert rig.status()["eagle"]["state"] == "down"
    metrics = httpx.get(rig.gw.url + "/metrics").text
    # Either the first request met the refused connect and failed over, or (on a loaded machine)
    # the health check saw the kill first and routing never tried eagle: no error, no retry.
    retried = 'reason="failover_retry"' in metrics
    assert retried == ('specgate_upstream_errors_total{backend="eagle",kind="connect"} 1.0' in metrics)
    assert rig.inflight() == 0


def test_draining_backend_stops_receiving_new_requests(rig: Rig) -> None:
    rig.fault(rig.eagle, kind="draining")
    eventually(lambda: rig.status()["eagle"]["state"] == "unready", SOON, "eagle seen draining")
    assert [rig.chat().headers["x-specgate-backend"] for _ in range(3)] == ["plain"] * 3
    rig.fault(rig.eagle, kind="clear")
    eventually(lambda: rig.status()["eagle"]["state"] == "ready", SOON, "eagle back")
    assert rig.chat().headers["x-specgate-backend"] == "eagle"


def test_hung_backend_times_out_with_504_and_is_avoided(rig: Rig) -> None:
    rig.fault(rig.eagle, kind="hang")
    with pytest.raises(openai.InternalServerError) as info:
        rig.chat()
    assert info.value.status_code == 504
    assert info.value.body["code"] == "upstream_timeout"  # type: ignore[index]
    assert rig.status()["eagle"]["state"] in ("failing", "unready")
    assert rig.chat().headers["x-specgate-backend"] == "plain"
    assert rig.inflight() == 0


def test_no_backend_left_is_a_503(rig: Rig) -> None:
    for sim in (rig.eagle, rig.plain):
        sim.signal(signal.SIGKILL)
        sim.wait(5)
    with pytest.raises(openai.APIStatusError) as info:
        rig.chat()
    assert info.value.status_code in (502, 503)
    eventually(lambda: httpx.get(rig.gw.url + "/ready").status_code == 503, SOON, "gateway not ready")
    with pytest.raises(openai.InternalServerError) as again:
        rig.chat()
    assert again.value.status_code == 503
    assert rig.inflight() == 0


def upstream_errors(rig: Rig, backend: str, kind: str) -> float:
    line = f'specgate_upstream_errors_total{{backend="{backend}",kind="{kind}"}} '
    found = [ln for ln in httpx.get(rig.gw.url + "/metrics").text.splitlines() if ln.startswith(line)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


EAGLE = {"x-specgate-route": "eagle"}


@pytest.mark.parametrize(
    ("fault", "status", "code", "kind"),
    [
        pytest.param("drop_mid_stream", 502, "disconnected", "disconnected", id="cut-halfway"),
        pytest.param("garbage_sse", 502, "malformed_body", "malformed_body", id="not-json"),
        pytest.param("stall_body", 504, "upstream_timeout", "idle_timeout", id="stalled-halfway"),
    ],
)
def test_a_non_streamed_body_that_fails_midway_is_an_openai_error(rig: Rig, fault: str, status: int, code: str, kind: str) -> None:
    rig.fault(rig.eagle, kind=fault)
    with pytest.raises(openai.APIStatusError) as info:
        rig.chat(extra_headers=EAGLE)
    assert info.value.status_code == status
    assert info.value.body["code"] == code and info.value.body["type"] == "server_error"  # type: ignore[index]
    assert info.value.response.headers["x-specgate-backend"] == "eagle"
    assert upstream_errors(rig, "eagle", kind) == 1
    assert rig.inflight() == 0
    if fault == "stall_body":  # a backend that stops mid-response is taken out until /health passes
        assert rig.status()["eagle"]["state"] in ("failing", "ready")
        eventually(lambda: rig.status()["eagle"]["state"] == "ready", SOON, "eagle back once /health passes")
    rig.fault(rig.eagle, kind="clear")
    assert rig.chat(extra_headers=EAGLE).parse().choices[0].finish_reason == "length"


def stream_events(rig: Rig, max_tokens: int) -> list[bytes]:
    """The `data:` payloads of a streamed chat forced to eagle, read raw (an error event included)."""
    body = {"model": rig.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", rig.gw.url + "/v1/chat/completions", json=body, headers=EAGLE, timeout=30) as resp:
        assert resp.status_code == 200
        return [line[6:].encode() for line in resp.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize(
    ("fault", "kinds"),
    [
        pytest.param("drop_mid_stream", ("disconnected", "truncated"), id="connection-cut"),
        pytest.param("garbage_sse", ("malformed_event",), id="not-json"),
    ],
)
def test_a_stream_that_fails_midway_ends_with_an_error_event_and_done(rig: Rig, fault: str, kinds: tuple[str, ...]) -> None:
    rig.fault(rig.eagle, kind=fault, after_chunks=3)
    events = stream_events(rig, 40)
    *chunks, error, done = events
    assert done == b"[DONE]"
    assert orjson.loads(error)["error"]["code"] in kinds  # whichever the upstream connection showed first
    assert 1 <= len(chunks) <= 4 and all("choices" in orjson.loads(c) for c in chunks)  # relayed until the fault
    assert sum(upstream_errors(rig, "eagle", kind) for kind in kinds) == 1
    assert rig.inflight() == 0
    rig.fault(rig.eagle, kind="clear")
    assert stream_events(rig, 5)[-1] == b"[DONE]"
