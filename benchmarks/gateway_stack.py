"""One `specgate serve` and its simulated servers for a benchmark: started, awaited until the gateway
sees both backends ready, and stopped on every path."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import tomli_w

from backends.process import Child
from backends.readiness import wait_until_ready
from loadtest.envelope.harness import Ports, StackSettings, gateway_config, specgate_executable

STARTUP_TIMEOUT = 120.0


class GatewayStack:
    """`specgate serve --config` written from `stack` on `ports`, logging under `work`."""

    def __init__(self, stack: StackSettings, ports: Ports, work: Path) -> None:
        self.ports = ports
        work.mkdir(parents=True, exist_ok=True)
        config_path = work / "specgate.toml"
        config_path.write_text(tomli_w.dumps(gateway_config(stack, ports)))
        self.child = Child("gateway", [specgate_executable(), "serve", "--config", str(config_path)], log_path=work / "gateway.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.gateway}"

    async def __aenter__(self) -> GatewayStack:
        self.child.start()
        try:
            for port in (self.ports.eagle, self.ports.plain, self.ports.gateway):
                await wait_until_ready(f"http://127.0.0.1:{port}", self.child, STARTUP_TIMEOUT)
            await self._both_ready()
        except BaseException:
            await self.child.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.child.stop()

    async def status(self) -> dict[str, Any]:
        """The gateway's /admin/status."""
        async with aiohttp.ClientSession() as session, session.get(self.url + "/admin/status") as resp:
            return orjson.loads(await resp.read())  # type: ignore[no-any-return]

    async def _both_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if all(b["state"] == "ready" for b in (await self.status())["backends"]):
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"the gateway never saw both backends ready:\n{self.child.last_lines()}")
