"""Traces and the access log end to end: a client's `traceparent` through the gateway's spans (decoded from
the OTLP/HTTP protobuf an in-process receiver gets) to the one the simulated SGLang server received.

One gateway (two worker processes, `sample_ratio = 0`: only what a client samples is recorded) in
front of two simulators with their test routes; the access log goes to a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backends.testbed import GatewayProcess, SimFactory, SimHandle, start_gateway
from tests.gateway.otlp_receiver import OtlpReceiver, attributes
from tests.gateway.test_e2e_faults import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SIM_ARGS = ("--enable-test-endpoints", "--enable-cache-report")
TRACE_ID, CLIENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
MESSAGES = [{"role": "user", "content": "hello there"}]


@dataclass
class Stack:
    gw: GatewayProcess
    sims: dict[str, SimHandle]
    receiver: OtlpReceiver
    access_log: Path
    model: str

    def client(self, key: str = "acme-key") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gw.url + "/v1", api_key=key, max_retries=0)

    def upstream_trace_headers(self, backend: str, rid: str) -> dict[str, str]:
        """The trace headers the simulated SGLang server got with request `rid`."""
        (found,) = httpx.get(self.sims[backend].url() + "/_test/requests", params={"rid": rid}).json()
        return found["trace_headers"]  # type: ignore[no-any-return]

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.access_log.read_text().splitlines()] if self.access_log.exists() else []


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("tracing")
    receiver = OtlpReceiver()
    with SimFactory() as factory:
        sims = {role: factory.start("--role", role, *SIM_ARGS) for role in ("eagle", "plain")}
        config = tmp / "gateway.toml"
        config.write_text(
            "[server]\nworkers = 2\n"
            f'[telemetry]\notlp_endpoint = "{receiver.url}"\nservice_name = "specgate-test"\nsample_ratio = 0.0\n'
            f'[logging]\naccess_log = "{tmp / "access.log"}"\n'
            '[security]\napi_keys = ["plain-key"]\ntenants = [{name = "acme", api_keys = ["acme-key"]}]\n'
            + "".join(
                f'[[backends]]\nname = "{role}"\nurl = "{sim.url()}"\nspeculative = {str(role == "eagle").lower()}\n'
                for role, sim in sims.items()
            )
        )
        gw = start_gateway(config=config)
        try:
            auth = {"authorization": "Bearer plain-key"}
            eventually(lambda: httpx.get(gw.url + "/ready").status_code == 200, 10, "gateway ready")
            model = httpx.get(gw.url + "/v1/models", headers=auth).json()["data"][0]["id"]
            yield Stack(gw, sims, receiver, tmp / "access.log", model)
        finally:
            gw.stop()
            receiver.close()


def test_one_trace_runs_from_the_clients_traceparent_through_the_gateway_to_sglang(stack: Stack) -> None:
    raw = stack.client().chat.completions.with_raw_response.create(
        model=stack.model, messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True},
        extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "vendor=abc"},
    )
    chunks = [chunk for chunk in raw.parse() if chunk.choices and chunk.choices[0].delta.content]
    rid, backend = raw.headers["x-request-id"], raw.headers["x-specgate-backend"]

    spans = eventually(lambda: (found := stack.receiver.trace(TRACE_ID)) and len(found) == 4 and found, 15, "the four spans")
    root, route, upstream, relay = (spans[name] for name in ("POST /v1/chat/completions", "route", "upstream", "relay"))
    assert root.parent_span_id.hex() == CLIENT_SPAN and root.kind == root.SPAN_KIND_SERVER
    assert all(s.parent_span_id == root.span_id for s in (route, upstream, relay))
    assert attributes(root.attributes).items() >= {
        "specgate.request_id": rid, "http.response.status_code": 200, "specgate.tenant": "acme",
        "gen_ai.request.model": stack.model, "url.path": "/v1/chat/completions",
    }.items()
    decision = attributes(route.attributes)
    assert decision["specgate.route.policy"] == "adaptive" and decision["specgate.route.backend"] == backend
    assert decision["specgate.route.mode"] == ("eagle" if backend == "eagle" else "plain")
    assert decision["specgate.route.group"] == backend and decision["specgate.route.rule"].startswith("adaptive")
    assert decision["specgate.route.prefix_tokens_expected"] == 0
    exchange = attributes(upstream.attributes)
    assert upstream.kind == upstream.SPAN_KIND_CLIENT and exchange["specgate.failover"] is False
    assert attributes(relay.attributes)["specgate.token_chunks"] == len(chunks) >= 1  # EAGLE's chunks carry several tokens
    assert exchange["gen_ai.usage.output_tokens"] == 6 and exchange["gen_ai.response.finish_reasons"] == ["length"]
    assert exchange["http.response.status_code"] == 200 and exchange["specgate.backend"] == backend
    assert [event.name for event in upstream.events] == ["first_token"]
    assert upstream.start_time_unix_nano < upstream.events[0].time_unix_nano <= relay.end_time_unix_nano
    assert root.start_time_unix_nano <= route.start_time_unix_nano < route.end_time_unix_nano <= upstream.start_time_unix_nano
    assert {r["service.name"] for r in stack.receiver.resources(TRACE_ID)} == {"specgate-test"}

    # SGLang parents its own spans on the gateway's upstream span, in the client's trace.
    sent = stack.upstream_trace_headers(backend, rid)
    assert sent == {"traceparent": f"00-{TRACE_ID}-{upstream.span_id.hex()}-01", "tracestate": "vendor=abc"}

    exported = repr([span for _, span in stack.receiver.spans])
    assert "acme" in exported and "acme-key" not in exported  # the tenant's name, never its key
    (line,) = [line for line in stack.log_lines() if line["request_id"] == rid]
    assert line["trace_id"] == TRACE_ID and line["tenant"] == "acme" and line["backend"] == backend
    assert (line["status"], line["completion_tokens"], line["client_gone"], line["failover"]) == (200, 6, False, False)
    assert line["ttft_ms"] is not None and 0 < line["ttft_ms"] <= line["e2e_ms"]


def test_unsampled_requests_pass_their_trace_on_and_record_no_span(stack: Stack) -> None:
    client = stack.client("plain-key")  # one keep-alive connection: one worker, whose spans leave in order
    unsampled = f"00-{'1' * 32}-{'2' * 16}-00"
    quiet = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=MESSAGES, max_tokens=2, extra_headers={"traceparent": unsampled}
    )
    fresh = client.chat.completions.with_raw_response.create(model=stack.model, messages=MESSAGES, max_tokens=2)
    marker = "3" * 32
    client.chat.completions.create(
        model=stack.model, messages=MESSAGES, max_tokens=2, extra_headers={"traceparent": f"00-{marker}-{'4' * 16}-01"}
    )
    eventually(lambda: len(stack.receiver.trace(marker)) == 4, 15, "the sampled marker's spans")
    assert stack.receiver.trace("1" * 32) == {}
    assert stack.upstream_trace_headers(quiet.headers["x-specgate-backend"], quiet.headers["x-request-id"]) == {
        "traceparent": unsampled  # the client's own span, unchanged: the gateway recorded none
    }
    sent = stack.upstream_trace_headers(fresh.headers["x-specgate-backend"], fresh.headers["x-request-id"])["traceparent"]
    version, trace_id, _, flags = sent.split("-")
    assert (version, flags) == ("00", "00") and stack.receiver.trace(trace_id) == {}
    lines = {line["request_id"]: line for line in stack.log_lines()}
    assert lines[fresh.headers["x-request-id"]]["trace_id"] == trace_id  # the log still names the trace
    assert lines[quiet.headers["x-request-id"]]["tenant"] is None  # an unnamed key


def test_an_invalid_traceparent_starts_a_new_trace(stack: Stack) -> None:
    raw = stack.client().chat.completions.with_raw_response.create(
        model=stack.model, messages=MESSAGES, max_tokens=2, extra_headers={"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"}
    )
    sent = stack.upstream_trace_headers(raw.headers["x-specgate-backend"], raw.headers["x-request-id"])["traceparent"]
    assert sent.split("-")[1] != "0" * 32 and sent.endswith("-00")  # a new, unsampled trace (ratio 0)
