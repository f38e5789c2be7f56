"""A client that stops reading a stream: the gateway stops reading the backend, then delivers it all.

Through a real gateway process, both ways a stream is relayed (pushed from the upstream socket's
read callback, and pulled in the request's task): while the client reads nothing, the backend must
end up blocked on its writes instead of the gateway buffering the stream in memory; once the
client reads again every event arrives, in order, and the request's slot is given back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from backends.testbed import start_gateway
from tests.gateway.fake_backend import MODEL, FakeBackend, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOKENS = 1500
TEXT = "x" * 32_768  # 48 MB in all: beyond every socket buffer between the backend and the client


def _events(body: bytes) -> list[bytes]:
    """The SSE events of a chunked response body."""
    pieces, at = [], 0
    while True:
        eol = body.index(b"\r\n", at)
        n = int(body[at:eol], 16)
        pieces.append(body[eol + 2 : eol + 2 + n])
        at = eol + 4 + n
        if n == 0:
            return [e for e in b"".join(pieces).split(b"\n\n") if e]


async def _stalled(fake: FakeBackend, quiet: float, within: float) -> int:
    """How many chunks the backend wrote once it made no progress for `quiet` seconds."""
    deadline = time.monotonic() + within
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline and fake.written < TOKENS:
        if fake.written != last:
            last, since = fake.written, time.monotonic()
        elif time.monotonic() - since > quiet:
            break
        await asyncio.sleep(0.05)
    return fake.written


# A service tier takes FastAPI's full route, whose middleware wraps `send`: the relay is pulled there.
@pytest.mark.parametrize("extra", [{}, {"service_tier": "auto"}], ids=["pushed", "pulled"])
async def test_a_client_that_stops_reading_stalls_the_backend_then_gets_every_event(tmp_path: Path, extra: dict[str, str]) -> None:
    fake = FakeBackend(tokens=TOKENS, token_gap=0.0, text=TEXT)
    async with serving(fake):
        config = tmp_path / "gateway.toml"
        config.write_text("".join(
            f'[[backends]]\nname = "{name}"\nurl = "{fake.url}"\nspeculative = {spec}\n' for name, spec in (("eagle", "true"), ("plain", "false"))
        ))
        gw = await asyncio.to_thread(start_gateway, config=config)
        try:
            url = urlsplit(gw.url)
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
            body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, **extra})
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%b" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            written = await _stalled(fake, quiet=1.0, within=60)
            assert written < TOKENS, "the backend wrote the whole stream while the client read nothing"
            events = _events(await reader.read())  # until the gateway closes the connection
            writer.close()
            assert events[-1] == b"data: [DONE]"
            tokens = [e for e in events if b'"content":"' in e]
            assert len(tokens) == TOKENS and all(b'"content":"' + TEXT.encode() + b'"' in e for e in tokens[1:])
            status = await asyncio.to_thread(lambda: httpx.get(gw.url + "/admin/status").json())
            assert sum(b["inflight"] for b in status["backends"]) == 0
        finally:
            await asyncio.to_thread(gw.stop)
