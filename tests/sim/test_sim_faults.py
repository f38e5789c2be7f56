"""Test-only fault injection: each fault kind does what the reliability suite relies on."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from backends.testbed import SimFactory, SimHandle

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True}


@pytest.fixture(scope="module")
def sim(module_sims: SimFactory) -> SimHandle:
    return module_sims.start("--role", "plain", "--time-scale", "0.2", "--enable-test-endpoints")


@pytest.fixture
def http(sim: SimHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url(), timeout=10) as client:
        yield client
        client.post("/_test/fault", json={"kind": "clear"})


def set_fault(http: httpx.Client, **spec: object) -> list[dict[str, object]]:
    resp = http.post("/_test/fault", json=spec)
    assert resp.status_code == 200, resp.text
    faults: list[dict[str, object]] = resp.json()["faults"]
    return faults


def test_fault_listing_and_clear(http: httpx.Client) -> None:
    assert http.get("/_test/fault").json() == {"faults": []}
    set_fault(http, kind="slow_first_token", seconds=0.1)
    set_fault(http, kind="draining")
    kinds = {f["kind"] for f in http.get("/_test/fault").json()["faults"]}
    assert kinds == {"slow_first_token", "draining"}
    assert set_fault(http, kind="clear") == []


@pytest.mark.parametrize("spec", [{"kind": "explode"}, {"kind": "slow_first_token"}, {"kind": "hang", "bogus": 1}])
def test_bad_fault_specs_are_refused(http: httpx.Client, spec: dict[str, object]) -> None:
    resp = http.post("/_test/fault", json=spec)
    assert resp.status_code == 400 and resp.json()["message"].startswith("invalid fault:")


def test_draining_fails_health_but_serves(http: httpx.Client) -> None:
    set_fault(http, kind="draining")
    for path in ("/ready", "/health", "/health_generate"):
        resp = http.get(path)
        assert resp.status_code == 503 and resp.content == b""
    assert http.post("/v1/chat/completions", json={**CHAT, "stream": False}).status_code == 200
    set_fault(http, kind="clear")
    assert http.get("/ready").status_code == 200 and http.get("/health").status_code == 200


def test_slow_first_token_holds_back_headers(http: httpx.Client) -> None:
    set_fault(http, kind="slow_first_token", seconds=0.6)
    start = time.monotonic()
    with http.stream("POST", "/v1/chat/completions", json=CHAT) as resp:
        headers_after = time.monotonic() - start
        body = resp.read()
    assert headers_after >= 0.6
    assert body.endswith(b"data: [DONE]\n\n")


def test_drop_mid_stream_cuts_the_connection(http: httpx.Client) -> None:
    set_fault(http, kind="drop_mid_stream", after_chunks=2)
    events: list[bytes] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        http.stream("POST", "/v1/chat/completions", json={**CHAT, "rid": "dropped"}) as resp,
    ):
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line.encode())
    assert len(events) == 3  # two chunks: role + first text, then the second text
    (entry,) = http.get("/_test/requests", params={"rid": "dropped"}).json()
    assert entry["state"] == "aborted"
    set_fault(http, kind="clear")
    assert http.post("/v1/chat/completions", json={**CHAT, "stream": False}).status_code == 200


def test_garbage_sse_then_carries_on(http: httpx.Client) -> None:
    set_fault(http, kind="garbage_sse", after_chunks=1)
    body = http.post("/v1/chat/completions", json=CHAT).content
    events = [e[len(b"data: ") :] for e in body[:-2].split(b"\n\n")]
    bad = [e for e in events if e != b"[DONE]" and not e.startswith(b'{"')]
    assert bad == [b"{this is not json"]
    assert events[-1] == b"[DONE]"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(bad[0])


def test_truncated_sse_ends_without_done(http: httpx.Client) -> None:
    set_fault(http, kind="truncated_sse", after_chunks=1)
    resp = http.post("/v1/chat/completions", json={**CHAT, "rid": "truncated"})
    assert resp.status_code == 200
    assert b"[DONE]" not in resp.content and not resp.content.endswith(b"\n\n")
    (entry,) = http.get("/_test/requests", params={"rid": "truncated"}).json()
    assert entry["state"] == "aborted"


@pytest.mark.parametrize("kind", ["drop_mid_stream", "stall_body"])
def test_a_non_streamed_body_can_be_cut_or_stalled_halfway(http: httpx.Client, kind: str) -> None:
    set_fault(http, kind=kind)
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": False}, timeout=2.0) as resp:
        assert resp.status_code == 200
        declared = int(resp.headers["content-length"])
        received = b""
        with pytest.raises(httpx.RemoteProtocolError if kind == "drop_mid_stream" else httpx.ReadTimeout):
            for piece in resp.iter_raw():
                received += piece
    assert len(received) == declared // 2


def test_garbage_sse_makes_a_non_streamed_body_not_json(http: httpx.Client) -> None:
    set_fault(http, kind="garbage_sse")
    resp = http.post("/v1/chat/completions", json={**CHAT, "stream": False})
    assert resp.status_code == 200 and resp.content == b"{this is not json"


def test_hang_answers_nothing_until_cleared(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 400}) as running:
        lines = running.iter_lines()
        next(lines)
        set_fault(http, kind="hang")
        for path in ("/ready", "/health", "/v1/models"):
            with pytest.raises(httpx.ReadTimeout):
                http.get(path, timeout=0.3)
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=CHAT, timeout=0.3)
        assert [f["kind"] for f in http.get("/_test/fault").json()["faults"]] == ["hang"]
        set_fault(http, kind="clear")
        rest = list(lines)  # the frozen stream resumes and completes
    assert rest[-2] == "data: [DONE]"
    assert http.get("/ready").status_code == 200


def test_hang_from_the_start(sims: SimFactory) -> None:
    sim = sims.start("--role", "eagle", "--test-fault", "hang", "--enable-test-endpoints", wait_ready=False)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(sim.url() + "/ready", timeout=0.5)
    assert httpx.get(sim.url() + "/_test/fault").json()["faults"][0]["kind"] == "hang"


def test_crash_kills_the_process(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain", "--enable-test-endpoints")
    assert httpx.post(sim.url() + "/_test/fault", json={"kind": "crash"}).status_code == 200
    assert sim.wait(timeout=5) == -signal.SIGKILL


def test_test_routes_are_off_by_default(sims: SimFactory) -> None:
    sim = sims.start("--role", "plain")
    assert httpx.get(sim.url() + "/_test/requests").status_code == 404
    assert httpx.post(sim.url() + "/_test/fault", json={"kind": "crash"}).status_code == 404
