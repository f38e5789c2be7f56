"""The envelope's run: the simulated stack started here and swept direct and through specgate.

The gateway is started exactly as a user would (`specgate serve --config <generated TOML>`); it
starts the simulated EAGLE and plain servers itself. The direct targets are those same two
simulator ports, so specgate is compared with the very servers it routes to (every simulator's
prefix cache is flushed before each target's run of each level: `cache_flush.py`). In the colocated
topology a fourth target, `adaptive` (one SGLang-like server that turns speculation off above a
batch size), runs as its own simulator process on its own simulated GPU.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson
import tomli_w

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready
from backends.sim_argv import SimCommon, SimServer, sim_argv
from loadtest.cache_flush import CacheFlush
from loadtest.monitor import CpuMeter, descendants
from loadtest.results import LevelResult
from loadtest.slip import SlipProbe
from loadtest.sweep import Progress, Sweep, SweepSettings, Target
from loadtest.verdicts import Comparison

Topology = Literal["partitioned", "colocated", "groups"]
DIRECT = ("eagle", "plain")
STARTUP_TIMEOUT = 120.0


@dataclass(frozen=True)
class StackSettings:
    """What to start: profile, topology, routing policy, simulator time scale."""

    profile: str | None
    profile_file: Path | None
    topology: Topology
    policy: str
    policy_params: dict[str, Any] = field(default_factory=dict)
    time_scale: float = 1.0
    seed: int = 0
    eagle_max_running_requests: int | None = None  # None: the profile's own cap


@dataclass(frozen=True)
class Ports:
    """Loopback ports of everything the envelope starts."""

    gateway: int
    eagle: int
    plain: int
    adaptive: int | None

    @classmethod
    def pick(cls, topology: Topology) -> Ports:
        """Free ports for this topology."""
        port = free_loopback_port
        return cls(port(), port(), port(), port() if topology == "colocated" else None)


def gateway_config(stack: StackSettings, ports: Ports) -> dict[str, Any]:
    """The gateway's TOML config as a dict: policy, and a `[launch]` of the simulated servers."""
    launch: dict[str, Any] = {
        "engine": "sim",
        "topology": stack.topology,
        "time_scale": stack.time_scale,
        "seed": stack.seed,
        "eagle": {"port": ports.eagle}
        | ({"max_running_requests": stack.eagle_max_running_requests} if stack.eagle_max_running_requests else {}),
        "plain": {"port": ports.plain},
    }
    if stack.profile_file is not None:
        launch["profile_file"] = str(stack.profile_file)
    if stack.profile is not None:
        launch["profile"] = stack.profile
    return {
        "server": {"host": "127.0.0.1", "port": ports.gateway, "log_level": "warning"},
        "policy": {"name": stack.policy, **stack.policy_params},
        "launch": launch,
    }


def specgate_executable() -> str:
    """The `specgate` command of this interpreter's environment."""
    beside = Path(sys.executable).with_name("specgate")
    if beside.exists():
        return str(beside)
    found = shutil.which("specgate")
    if found is None:
        raise RuntimeError("the `specgate` command is not installed (pip install -e .)")
    return found


def adaptive_argv(stack: StackSettings, port: int) -> list[str]:
    """The single adaptive-speculation server of the colocated comparison (built by the one simulator argv builder)."""
    common = SimCommon(profile=stack.profile, profile_file=stack.profile_file, time_scale=stack.time_scale, seed=stack.seed)
    return list(sim_argv(common, SimServer(role="adaptive", host="127.0.0.1", port=port)))


class Envelope:
    """Starts the stack, sweeps it, stops it (on every path), and returns the results document."""

    def __init__(self, stack: StackSettings, settings: SweepSettings, out_dir: Path, progress: Progress) -> None:
        self.stack = stack
        self.settings = settings
        self.out_dir = out_dir
        self.progress = progress
        self.ports = Ports.pick(stack.topology)
        self.config_path = out_dir / "specgate.toml"

    def targets(self) -> list[Target]:
        """eagle and plain direct, specgate, and adaptive in the colocated topology."""
        p = self.ports
        targets = [
            Target("eagle", f"http://127.0.0.1:{p.eagle}"),
            Target("plain", f"http://127.0.0.1:{p.plain}"),
            Target("specgate", f"http://127.0.0.1:{p.gateway}"),
        ]
        if p.adaptive is not None:
            targets.append(Target("adaptive", f"http://127.0.0.1:{p.adaptive}"))
        return targets

    def comparison(self) -> Comparison:
        """specgate judged against the two servers it routes to (not the colocated `adaptive`)."""
        return Comparison("specgate", DIRECT)

    def describe(self) -> str:
        """The report's sentence on what the targets are."""
        adaptive = (
            ", `adaptive` is one server that speculates only at low batch sizes (SGLang `--speculative-adaptive` style)"
            if self.stack.topology == "colocated"
            else ""
        )
        return (
            "Targets: `eagle` and `plain` are the simulated SGLang servers called directly; `specgate` is the gateway "
            f"in front of those same two servers{adaptive}."
        )

    def layout(self) -> str:
        """The title's words for the stack's layout."""
        return self.stack.topology

    async def run(self, command: str) -> tuple[list[LevelResult], dict[str, Any]]:
        """Run the envelope; returns the level results and what the stack looked like."""
        began = time.monotonic()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        config = gateway_config(self.stack, self.ports)
        self.config_path.write_text(tomli_w.dumps(config))
        logs = self.out_dir / "logs"
        gateway = Child("gateway", [specgate_executable(), "serve", "--config", str(self.config_path)], log_path=logs / "gateway.log")
        children = [gateway]
        if self.ports.adaptive is not None:
            children.append(Child("adaptive", adaptive_argv(self.stack, self.ports.adaptive), log_path=logs / "adaptive.log"))
        try:
            for child in children:
                child.start()
            status = await self._wait_ready(gateway, children[1:])
            for child in children:
                child.note_descendants()
            sims = [t.url for t in self.targets() if t.name != "specgate"]
            cpu = CpuMeter({
                "gateway": lambda: [gateway.pid],
                "sims": lambda: [*descendants(gateway.pid), *(c.pid for c in children[1:])],
            })
            # The targets share these servers, so each meets each level with their caches flushed.
            async with SlipProbe(sims) as slip, CacheFlush(sims) as flush:
                results = await Sweep(self.targets(), self.settings, self.progress, cpu, slip, flush).run()
        finally:
            for child in reversed(children):
                await child.stop()
        return results, {"config": config, "gateway_status": status, "run_seconds": time.monotonic() - began}

    async def _wait_ready(self, gateway: Child, others: list[Child]) -> dict[str, Any]:
        p = self.ports
        for port in (p.eagle, p.plain):
            await wait_until_ready(f"http://127.0.0.1:{port}", gateway, STARTUP_TIMEOUT)
        await wait_until_ready(f"http://127.0.0.1:{p.gateway}", gateway, STARTUP_TIMEOUT)
        for child in others:
            await wait_until_ready(f"http://127.0.0.1:{p.adaptive}", child, STARTUP_TIMEOUT)
        return await self._both_backends_ready(gateway)

    async def _both_backends_ready(self, gateway: Child) -> dict[str, Any]:
        """Wait until the gateway's health checker routes to both backends, so C=1 is not one-sided."""
        url = f"http://127.0.0.1:{self.ports.gateway}/admin/status"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for _ in range(int(STARTUP_TIMEOUT / 0.2)):
                async with session.get(url) as resp:
                    status = orjson.loads(await resp.read())
                if all(b["state"] == "ready" for b in status["backends"]):
                    return status
                if not gateway.running:
                    break
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the gateway never saw both backends ready; its last output:\n{gateway.last_lines()}")
