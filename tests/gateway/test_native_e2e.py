"""SGLang's native `/generate`, tokenize/detokenize and `/abort_request` through `specgate serve`.

One gateway in front of two simulated backends (10x time-scale, test-only routes on) serves the
module; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from backends.testbed import SimFactory
from tests.gateway.test_e2e_faults import Rig, eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with SimFactory() as sims:
        r = Rig(sims, tmp_path_factory.mktemp("native"), health="ready_interval = 0.2", timeouts="first_byte = 5.0\nidle = 5.0")
        try:
            yield r
        finally:
            r.gw.stop()


def post(rig: Rig, body: object, path: str = "/generate", method: str = "POST", **headers: str) -> httpx.Response:
    return httpx.request(method, rig.gw.url + path, content=orjson.dumps(body), headers=headers, timeout=30)


def counter(rig: Rig, name: str, **labels: str) -> float:
    """A gateway counter's value (0 when absent)."""
    text = httpx.get(rig.gw.url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def data_events(lines: Iterator[str]) -> Iterator[Any]:
    """Decoded `data:` payloads of an SSE stream; `[DONE]` as the string."""
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else orjson.loads(payload)


def test_single_counts_tokens_from_meta_info(rig: Rig) -> None:
    before = {b: counter(rig, "specgate_output_tokens_total", backend=b) for b in ("eagle", "plain")}
    resp = post(rig, {"text": "the sea is far", "sampling_params": {"max_new_tokens": 7}})
    assert resp.status_code == 200
    backend = resp.headers["x-specgate-backend"]
    meta = resp.json()["meta_info"]
    assert meta["completion_tokens"] == 7 and meta["prompt_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "length": 7}
    assert meta["id"] == resp.headers["x-request-id"]  # the gateway names the request upstream
    assert counter(rig, "specgate_output_tokens_total", backend=backend) == before[backend] + 7
    assert counter(rig, "specgate_requests_total", backend=backend, endpoint="generate", status="200") >= 1
    assert rig.inflight() == 0


def test_put_with_input_ids_and_forced_route(rig: Rig) -> None:
    resp = post(rig, {"input_ids": [11, 12], "sampling_params": {"max_new_tokens": 3}}, method="PUT",
                **{"x-specgate-route": "plain"})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"
    assert resp.json()["meta_info"]["completion_tokens"] == 3


def test_batch_returns_every_output(rig: Rig) -> None:
    body = {"text": ["one", "two sea"], "sampling_params": {"max_new_tokens": 4, "n": 2}}
    outs = post(rig, body).json()
    assert len(outs) == 4 and all(o["meta_info"]["completion_tokens"] == 4 for o in outs)
    assert rig.inflight() == 0


def test_stream_relays_events_and_done(rig: Rig) -> None:
    before = counter(rig, "specgate_requests_total", backend="eagle", endpoint="generate", status="200")
    with httpx.stream("POST", rig.gw.url + "/generate", timeout=30, content=orjson.dumps(
        {"text": "go", "stream": True, "sampling_params": {"max_new_tokens": 12}}
    ), headers={"x-specgate-route": "eagle"}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = list(data_events(resp.iter_lines()))
    assert events[-1] == "[DONE]"
    counts = [e["meta_info"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[-1] == 12
    assert counter(rig, "specgate_requests_total", backend="eagle", endpoint="generate", status="200") == before + 1
    assert rig.inflight() == 0


def test_batched_stream_holds_its_weight_in_flight_and_aborts_on_disconnect(rig: Rig) -> None:
    body = {"text": ["a b", "c"], "rid": "wb", "stream": True, "sampling_params": {"max_new_tokens": 5000, "n": 2, "ignore_eos": True}}
    with httpx.stream("POST", rig.gw.url + "/generate", content=orjson.dumps(body), timeout=30) as resp:
        sim = rig.eagle if resp.headers["x-specgate-backend"] == "eagle" else rig.plain
        events = data_events(resp.iter_lines())  # held: dropping the generator would close the stream
        assert "index" in next(events)
        assert rig.inflight() == 4  # two prompts x n=2: four sequences upstream
    eventually(lambda: rig.inflight() == 0, 2.0, "in-flight back to 0")
    for i in range(4):
        eventually(lambda i=i: (rig.sim_request(sim, f"wb_{i}") or {}).get("state") == "aborted", 2.0, f"wb_{i} aborted")


def test_abort_request_reaches_the_backend_holding_the_rid(rig: Rig) -> None:
    body = {"text": "long", "rid": "to-abort", "stream": True, "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}
    with httpx.stream("POST", rig.gw.url + "/generate", content=orjson.dumps(body), timeout=30) as resp:
        events = data_events(resp.iter_lines())
        next(events)
        assert post(rig, {"rid": "to-abort"}, "/abort_request").status_code == 200
        rest = list(events)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    eventually(lambda: rig.inflight() == 0, 2.0, "in-flight back to 0")


def test_abort_request_finds_one_sequence_of_a_batch(rig: Rig) -> None:
    # Long enough that the abort lands mid-sequence even when a loaded machine deschedules the test.
    body = {"text": ["x", "y"], "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with httpx.stream("POST", rig.gw.url + "/generate", content=orjson.dumps(body), timeout=30) as resp:
        rid = resp.headers["x-request-id"]
        events = data_events(resp.iter_lines())
        next(events)
        assert post(rig, {"rid": f"{rid}_1"}, "/abort_request").status_code == 200
        finished = {e["index"]: e["meta_info"]["finish_reason"]["type"] for e in events if e != "[DONE]" and e["meta_info"]["finish_reason"]}
    assert finished == {0: "length", 1: "abort"}


def test_abort_request_for_an_unknown_rid_goes_everywhere(rig: Rig) -> None:
    assert post(rig, {"rid": "nobody"}, "/abort_request").status_code == 200
    assert post(rig, {"rid": 3}, "/abort_request").status_code == 400


def test_gateway_refusal_uses_the_error_shape(rig: Rig) -> None:
    resp = post(rig, {"sampling_params": {"max_new_tokens": 3}})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "Either text, input_ids or input_embeds should be provided."
    assert post(rig, [1, 2]).status_code == 400
    bad = httpx.post(rig.gw.url + "/generate", content=b"{not json", timeout=10)
    assert bad.status_code == 400 and "error" in bad.json()


def test_upstream_error_is_relayed_in_sglangs_shape(rig: Rig) -> None:
    resp = post(rig, {"text": ["a", "b"], "rid": ["only-one"], "sampling_params": {"max_new_tokens": 2}})
    assert resp.status_code == 400
    assert resp.json() == {"error": {"message": "The specified rids length mismatch with the batch_size for batch processing."}}
    assert rig.inflight() == 0


def test_tokenize_and_detokenize_take_no_slot(rig: Rig) -> None:
    served = {name: b["requests_served"] for name, b in rig.status().items()}
    for path in ("/v1/tokenize", "/tokenize"):
        out = post(rig, {"model": rig.model, "prompt": "the sea"}, path)
        assert out.status_code == 200 and out.json()["count"] == 2
    tokens = post(rig, {"prompt": "the sea"}, "/v1/tokenize").json()["tokens"]
    for path in ("/v1/detokenize", "/detokenize"):
        assert post(rig, {"tokens": tokens}, path).json() == {"text": " the sea"}
    assert {name: b["requests_served"] for name, b in rig.status().items()} == served


def test_a_single_stream_feeds_the_adaptive_fit_and_a_batch_does_not(rig: Rig) -> None:
    def observations() -> float:
        beliefs = httpx.get(rig.gw.url + "/admin/status").json()["policy"]["beliefs"]
        return beliefs["backends"].get("plain", {}).get("observations", 0)  # no arm until it was routed to

    def stream(body: dict[str, Any]) -> None:
        with httpx.stream("POST", rig.gw.url + "/generate", content=orjson.dumps({**body, "stream": True}),
                          headers={"x-specgate-route": "plain"}, timeout=30) as resp:
            assert list(data_events(resp.iter_lines()))[-1] == "[DONE]"

    before = observations()
    stream({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 30}})
    assert observations() == before
    stream({"text": "a", "sampling_params": {"max_new_tokens": 30}})
    assert observations() > before  # its progress as it streamed, and its completion


def test_flush_cache_and_sglang_info_aliases_pass_through(rig: Rig) -> None:
    for method in ("POST", "GET"):
        flushed = httpx.request(method, rig.gw.url + "/flush_cache", params={"timeout": 5}, timeout=10)
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    assert httpx.get(rig.gw.url + "/get_model_info").json() == httpx.get(rig.gw.url + "/model_info").json()
    assert "internal_states" in httpx.get(rig.gw.url + "/get_server_info").json()


@pytest.fixture
def fresh_rig(sims: SimFactory, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(sims, tmp_path, health="ready_interval = 0.2", timeouts="first_byte = 5.0\nidle = 5.0")
    try:
        yield r
    finally:
        r.gw.stop()


def test_failover_before_the_first_byte_and_non_streaming_disconnect(fresh_rig: Rig) -> None:
    rig = fresh_rig
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(rig.gw.url + "/generate", timeout=0.5, headers={"x-specgate-route": "eagle"}, content=orjson.dumps(
            {"text": "a", "rid": "gone-native", "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}
        ))
    eventually(lambda: rig.inflight() == 0, 2.0, "in-flight back to 0")
    eventually(lambda: (rig.sim_request(rig.eagle, "gone-native") or {}).get("state") == "aborted", 2.0, "sim aborted it")
    rig.eagle.signal(signal.SIGKILL)
    rig.eagle.wait(5)
    resp = post(rig, {"text": "a", "sampling_params": {"max_new_tokens": 3}})
    assert resp.status_code == 200 and resp.headers["x-specgate-backend"] == "plain"  # retried after the refused connect
    assert rig.status()["eagle"]["state"] == "down" and rig.inflight() == 0
