"""Fuzz the running gateway: schemathesis cases from its OpenAPI schema, then malformed HTTP on raw sockets.

Every answer is judged the same way: a 5xx is allowed only when it says the backend failed (the
gateway relays it) or none is available; every error is OpenAI's JSON
`{"error": {"message", "type", "param", "code"}}`; a stream ends with `data: [DONE]`; and nothing
hangs (an answer, or the connection closed, within the deadline). Half of the generated requests
that carry a `model` get the served model id, so they get past the model check into the backends.

The gateway runs with its own simulated backends at a small context length (2048 tokens), so no
generated `max_tokens` can make a response take long.

    python -m benchmarks.fuzz --cases 1000 --mutations 500 --out docs/benchmarks/reliability-fuzz.md
    python -m benchmarks.fuzz --cases 150 --mutations 100       # the CI size (tests/reliability)
"""

from __future__ import annotations

import random
import shlex
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies
from schemathesis import GenerationMode

from backends.testbed import start_gateway
from benchmarks.output import publish

HANG_SECONDS = 20.0  # no answer and no close within this is a hang
ERROR_KEYS = {"message", "type", "param", "code"}
# 5xx codes that report the backends' state, not a fault of the gateway.
NOT_THE_GATEWAY = {"upstream_error", "upstream_unreachable", "upstream_timeout", "upstream_bad_response",
                   "no_backend_available", "shutting_down", "disconnected", "malformed_body"}
FUZZ_PROFILE = "context_length = 2048\n"


@dataclass
class FuzzResult:
    """Counts and the first examples of each kind of problem."""

    schema_cases: int = 0
    raw_cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    closed_without_answer: int = 0
    backend_5xx: list[str] = field(default_factory=list)  # relayed from a backend: reported, not the gateway's fault
    gateway_5xx: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)  # an error not in OpenAI's shape
    bad_streams: list[str] = field(default_factory=list)
    inflight_after: int = 0  # in-flight slots the gateway still held once the fuzzing was over

    def problems(self) -> dict[str, list[str]]:
        """The kinds of problem found, with examples (empty when the gateway passed)."""
        found = {"gateway 5xx": self.gateway_5xx, "hangs": self.hangs, "errors not in OpenAI's shape": self.bad_errors,
                 "streams without [DONE]": self.bad_streams,
                 "in-flight slots left": [str(self.inflight_after)] if self.inflight_after else []}
        return {kind: examples for kind, examples in found.items() if examples}

    def judge(self, what: str, status: int, content_type: str, body: bytes) -> None:
        """Record one answer and whatever is wrong with it."""
        self.statuses[status] += 1
        if status >= 400:
            error = _error_of(body)
            if error is None:
                self.bad_errors.append(f"{what} -> {status} {body[:120]!r}")
            elif status >= 500:
                (self.backend_5xx if error.get("code") in NOT_THE_GATEWAY else self.gateway_5xx).append(f"{what} -> {status} {error}")
        elif content_type.startswith("text/event-stream") and not _stream_ended(what, body):
            self.bad_streams.append(f"{what} -> ...{body[-120:]!r}")


def _stream_ended(what: str, body: bytes) -> bool:
    """Whether an SSE body ended as its API ends a stream: `data: [DONE]`, or for the Responses API
    (which has no [DONE]) its terminal event."""
    if " /v1/responses" in what:
        last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        return any(f"event: {kind}".encode() in last for kind in _RESPONSES_TERMINAL)
    return body.endswith(b"data: [DONE]\n\n")


_RESPONSES_TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def _error_of(body: bytes) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"error"} or not isinstance(doc["error"], dict) or set(doc["error"]) != ERROR_KEYS:
        return None
    return doc["error"]


def fuzz_schema(url: str, model: str, cases: int, result: FuzzResult, random_seed: int = 0) -> None:
    """`cases` schemathesis cases (valid and invalid per the schema) against every operation."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    strategy = strategies.one_of(schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE))
    session = requests.Session()

    @seed(random_seed)
    @given(case=strategy)
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def one(case: Any) -> None:
        result.schema_cases += 1
        kwargs = case.as_transport_kwargs(base_url=url)
        body = kwargs.get("json")
        if isinstance(body, dict) and "model" in body and result.schema_cases % 2 == 0:
            kwargs["json"] = {**body, "model": model}
        what = f"{kwargs['method']} {kwargs['url'].removeprefix(url)} {repr(kwargs.get('json', kwargs.get('data')))[:160]}"
        try:
            resp = session.request(**kwargs, timeout=HANG_SECONDS)
        except requests.Timeout:
            result.hangs.append(what)
            return
        result.judge(what, resp.status_code, resp.headers.get("content-type", ""), resp.content)

    one()
    session.close()


def _request(body: bytes, *, path: bytes = b"/v1/chat/completions", content_type: bytes = b"application/json",
             extra: bytes = b"", length: int | None = None) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        path, content_type, len(body) if length is None else length, extra)
    return head + body


def malformed_requests(model: str) -> Iterator[tuple[str, bytes]]:
    """The fixed raw-socket cases: truncation, content types, huge heads, invalid UTF-8, deep nesting, framing."""
    valid = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    yield "valid request", _request(valid)
    for cut in (1, len(valid) // 2, len(valid) - 1):
        yield f"body truncated to {cut} of {len(valid)} bytes", _request(valid[:cut], length=len(valid))
    whole = _request(valid)
    for cut in (5, 20, whole.index(b"\r\n\r\n")):
        yield f"head truncated at byte {cut}", whole[:cut]
    for ctype in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x", b"application/xml",
                  b"application/json; charset=latin-1", b"", b"\xff\xfe"):
        yield f"content type {ctype!r}", _request(valid, content_type=ctype)
    yield "no content type", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n" % len(valid) + valid
    for size in (64 * 1024 + 1, 1024 * 1024):
        yield f"one header of {size} bytes", _request(valid, extra=b"X-Big: " + b"a" * size + b"\r\n")
    yield "10,000 headers", _request(valid, extra=b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)))
    yield "URL of 100 KB", _request(valid, path=b"/v1/chat/completions?" + b"q" * 100_000)
    for name, bad in (("body string", b'{"model": "%s", "messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}' % model.encode()),
                      ("body key", b'{"model": "%s", "\xc3\x28": 1, "messages": [{"role": "user", "content": "x"}]}' % model.encode()),
                      ("model", b'{"model": "\xed\xa0\x80", "messages": [{"role": "user", "content": "x"}]}'),
                      ("whole body", b"\x80\x81\x82\xff")):
        yield f"invalid UTF-8 in the {name}", _request(bad)
    yield "invalid UTF-8 in the path", _request(valid, path=b"/v1/\xff\xfe")
    yield "invalid UTF-8 in a header", _request(valid, extra=b"X-Specgate-Route: \xff\xfe\r\n")
    yield "invalid UTF-8 in the authorization header", _request(valid, extra=b"Authorization: Bearer \xff\xfe\r\n")
    for depth in (32, 254, 255, 256, 1000, 100_000):
        for where, template in (("an extra field", b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "x": %s}'),
                                ("message content", b'{"model": "%s", "messages": [{"role": "user", "content": [%s]}]}')):
            nested = b'{"a":' * depth + b"1" + b"}" * depth
            yield f"JSON nested {depth} deep in {where}", _request(template % (model.encode(), nested))
        yield f"JSON array nested {depth} deep as the body", _request(b"[" * depth + b"]" * depth)
    yield "garbage", b"\x00\x01\x02\x03 garbage\r\n\r\n"
    yield "HTTP/0.9", b"GET /v1/models\r\n"
    yield "bad method", b"G=T /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n"
    yield "unknown method", b"BREW /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n"
    yield "bad Content-Length", _request(valid).replace(b"Content-Length: %d" % len(valid), b"Content-Length: abc")
    yield "negative Content-Length", _request(valid).replace(b"Content-Length: %d" % len(valid), b"Content-Length: -5")
    yield "two Content-Lengths", _request(valid, extra=b"Content-Length: 3\r\n")
    yield "Content-Length with Transfer-Encoding", _request(valid, extra=b"Transfer-Encoding: chunked\r\n")
    yield "bad chunk size", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    yield "chunked body cut short", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n{\"mo"
    yield "header without colon", _request(valid, extra=b"NoColonHere\r\n")
    yield "bare LF line endings", _request(valid).replace(b"\r\n", b"\n")
    yield "NUL in a header", _request(valid, extra=b"X-Nul: a\x00b\r\n")
    yield "pipelined valid and garbage", _request(valid) + b"\x00\x01garbage\r\n\r\n"


def mutations(model: str, count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """`count` valid requests with random bytes flipped, inserted or deleted (seeded)."""
    rng = random.Random(seed)
    base = [
        _request(orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": s}))
        for s in (False, True)
    ] + [b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n"]
    for i in range(count):
        data = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            match rng.randrange(3):
                case 0:
                    data[at] = rng.randrange(256)
                case 1:
                    data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
                case _:
                    del data[at:at + rng.randint(1, 8)]
        yield f"mutation {i}", bytes(data)


def send_raw(url: str, what: str, data: bytes, result: FuzzResult) -> None:
    """Send `data`; read the answer. No answer in a while: half-close, then it must answer or close."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    result.raw_cases += 1
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it refused the rest (an oversized head); its answer is still there to read
        answer, closed = _read_answer(sock, idle=1.0)
        if not answer and not closed:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            answer, closed = _read_answer(sock, idle=HANG_SECONDS)
            if not answer and not closed:
                result.hangs.append(what)
                return
    if not answer:
        result.closed_without_answer += 1
        return
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    content_type = next((line.split(b":", 1)[1].strip().decode("latin-1") for line in head.split(b"\r\n")
                         if line.lower().startswith(b"content-type:")), "")
    result.judge(what, status, content_type, _dechunk(head, body))


def _read_answer(sock: socket.socket, idle: float) -> tuple[bytes, bool]:
    """Bytes of the first response (stops once it is complete), and whether the peer closed."""
    sock.settimeout(idle)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return out, False
        except ConnectionResetError:
            return out, True
        if not chunk:
            return out, True
        out += chunk
        if _response_complete(out):
            return out, False


def _response_complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lines = head.lower().split(b"\r\n")
    for line in lines:
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    if b"transfer-encoding: chunked" in lines:
        return body.endswith(b"0\r\n\r\n")
    return False


def _dechunk(head: bytes, body: bytes) -> bytes:
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


def fuzz_raw(url: str, model: str, mutation_count: int, result: FuzzResult, seed: int = 0) -> None:
    """The fixed malformed requests, then `mutation_count` mutated ones."""
    for what, data in malformed_requests(model):
        send_raw(url, what, data, result)
    for what, data in mutations(model, mutation_count, seed):
        send_raw(url, what, data, result)


def settle_inflight(url: str, result: FuzzResult, within: float = 5.0) -> None:
    """Wait for the gateway's in-flight count to reach 0 (requests whose client left end shortly after)."""
    deadline = time.monotonic() + within
    while True:
        result.inflight_after = int(requests.get(url + "/admin/status", timeout=5).json()["inflight"])
        if result.inflight_after == 0 or time.monotonic() > deadline:
            return
        time.sleep(0.05)


@contextmanager
def fuzz_target(workdir: Path) -> Iterator[tuple[str, str]]:
    """`specgate serve` with its simulated backends at a 2048-token context; yields (url, model id)."""
    profile = workdir / "fuzz-profile.toml"
    profile.write_text(FUZZ_PROFILE)
    env = {"SPECGATE_LAUNCH__TIME_SCALE": "0.05", "SPECGATE_LAUNCH__PROFILE_FILE": str(profile)}
    gw = start_gateway(env=env)
    try:
        model = requests.get(gw.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        yield gw.url, model
    finally:
        code = gw.stop()
    if code != 0:
        raise RuntimeError(f"the gateway exited with {code}:\n{gw.text()[-3000:]}")


def report(result: FuzzResult, command: str, seconds: float) -> str:
    """The fuzz run as markdown."""
    problems = result.problems()
    statuses = ", ".join(f"{status}: {count}" for status, count in sorted(result.statuses.items()))
    lines = [
        "# Fuzzing the gateway",
        "",
        f"Command: `{command}`",
        "",
        ("schemathesis cases are generated from the gateway's `/openapi.json` (valid and invalid, every "
        "operation); raw-socket cases are hand-written malformed HTTP plus seeded random mutations of valid "
        f"requests. Target: `specgate serve` with its simulated backends (context 2048 tokens). {seconds:.0f} s."),
        "",
        "| figure | value |",
        "|---|---|",
        f"| schemathesis cases | {result.schema_cases} |",
        f"| raw-socket cases | {result.raw_cases} |",
        f"| answers by status | {statuses} |",
        f"| raw cases closed without an answer (incomplete request, then EOF) | {result.closed_without_answer} |",
        f"| 5xx that are the gateway's fault | {len(result.gateway_5xx)} |",
        f"| 5xx relayed from a backend | {len(result.backend_5xx)} |",
        f"| hangs | {len(result.hangs)} |",
        f"| errors not in OpenAI's shape | {len(result.bad_errors)} |",
        f"| streams without `data: [DONE]` | {len(result.bad_streams)} |",
        f"| in-flight slots held afterwards | {result.inflight_after} |",
        "",
        "Verdict: " + ("PASS" if not problems else "FAIL"),
    ]
    for kind, examples in {**problems, "5xx relayed from a backend": result.backend_5xx}.items():
        if examples:
            lines += ["", f"{kind} (first {min(len(examples), 5)}):", ""] + [f"- `{e[:300]}`" for e in examples[:5]]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--cases", type=click.IntRange(min=1), default=1000, show_default=True, help="schemathesis cases")
@click.option("--mutations", "mutation_count", type=click.IntRange(min=0), default=500, show_default=True, help="mutated raw requests")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="also write the report here")
def main(cases: int, mutation_count: int, seed: int, out: Path | None) -> None:
    """Fuzz `specgate serve` and print the report; exit 1 on any problem."""
    command = shlex.join(["python", "-m", "benchmarks.fuzz", *sys.argv[1:]])
    result = FuzzResult()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp, fuzz_target(Path(tmp)) as (url, model):
        fuzz_schema(url, model, cases, result, seed)
        fuzz_raw(url, model, mutation_count, result, seed)
        settle_inflight(url, result)
    text = report(result, command, time.monotonic() - started)
    publish(text, out)
    sys.exit(1 if result.problems() else 0)


if __name__ == "__main__":
    main()
