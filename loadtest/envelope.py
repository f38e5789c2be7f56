"""The envelope: the simulated stack started here, swept direct and through specgate, and the ratios.

The gateway is started exactly as a user would (`specgate serve --config <generated TOML>`); it
starts the simulated EAGLE and plain servers itself. The direct targets are those same two
simulator ports, so specgate is compared with the very servers it routes to. In the colocated
topology a fourth target, `adaptive` (one SGLang-like server that turns speculation off above a
batch size), runs as its own simulator process on its own simulated GPU.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson
import tomli_w

from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready
from loadtest.monitor import CpuMeter, descendants
from loadtest.report import build_document
from loadtest.slip import SlipProbe
from loadtest.sweep import LevelResult, Progress, Sweep, SweepSettings, Target

Topology = Literal["partitioned", "colocated"]
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
class Bound:
    """A bound the envelope is checked against: a per-level ratio key, `>=` or `<=` a value."""

    name: str
    op: Literal[">=", "<="]
    value: float

    def holds(self, ratio: float | None) -> bool:
        """Whether a level's ratio satisfies the bound (a missing ratio does not)."""
        if ratio is None:
            return False
        return ratio >= self.value if self.op == ">=" else ratio <= self.value


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
    """The single adaptive-speculation server of the colocated comparison."""
    argv = [sys.executable, "-m", "backends.sim", "--role", "adaptive", "--host", "127.0.0.1", "--port", str(port)]
    if stack.profile is not None:
        argv += ["--profile", stack.profile]
    if stack.profile_file is not None:
        argv += ["--profile-file", str(stack.profile_file)]
    argv += ["--time-scale", f"{stack.time_scale:g}", "--seed", str(stack.seed), "--enable-metrics"]
    return argv


def add_ratios(doc: dict[str, Any], bounds: Sequence[Bound]) -> bool:
    """Add each level's envelope ratios and the bound checks to `doc`; True when all bounds hold.

    throughput_ratio = specgate output tok/s / max(eagle, plain);
    tpot_ratio = specgate TPOT p50 / min(eagle, plain).
    """
    for level in doc["levels"]:
        t = level["targets"]
        best_tp = max(t[n]["output_tok_s"] for n in DIRECT)
        level["throughput_ratio"] = t["specgate"]["output_tok_s"] / best_tp if best_tp > 0 else None
        tpots = [t[n]["tpot_p50_ms"] for n in DIRECT if t[n]["tpot_p50_ms"] is not None]
        spec_tpot = t["specgate"]["tpot_p50_ms"]
        level["tpot_ratio"] = spec_tpot / min(tpots) if tpots and spec_tpot is not None else None
    checks = []
    for bound in bounds:
        measured = [(lv[bound.name], lv["concurrency"]) for lv in doc["levels"] if lv[bound.name] is not None]
        pick = min if bound.op == ">=" else max
        worst, worst_at = pick(measured, key=lambda rc: rc[0]) if measured else (float("nan"), None)
        met = len(measured) == len(doc["levels"]) and all(bound.holds(r) for r, _ in measured)
        checks.append({"name": bound.name, "op": bound.op, "bound": bound.value, "met": met, "worst": worst, "worst_at": worst_at})
    doc["envelope"] = {"checks": checks, "all_met": all(c["met"] for c in checks)}
    return doc["envelope"]["all_met"]


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
            async with SlipProbe(sims) as slip:
                results = await Sweep(self.targets(), self.settings, self.progress, cpu, slip).run()
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


def envelope_document(
    results: Sequence[LevelResult],
    envelope: Envelope,
    stack_info: dict[str, Any],
    command: str,
    bounds: Sequence[Bound],
    time_scale_note: str,
) -> tuple[dict[str, Any], bool]:
    """results.json of an envelope run, with ratios and checks; also whether every bound held."""
    stack = envelope.stack
    profile = stack.profile or str(stack.profile_file)
    params = ", ".join(f"{k}={v}" for k, v in stack.policy_params.items())
    extra = {
        "title": f"Envelope: {profile}, {stack.topology}, policy {stack.policy}" + (f" ({params})" if params else ""),
        "stack": {
            "profile": stack.profile,
            "profile_file": str(stack.profile_file) if stack.profile_file else None,
            "topology": stack.topology,
            "policy": stack.policy,
            "policy_params": stack.policy_params,
            "eagle_max_running_requests": stack.eagle_max_running_requests,
            "time_scale": stack.time_scale,
            "time_scale_note": time_scale_note,
            **stack_info,
        },
        "preamble": [_targets_sentence(stack.topology), _scale_sentence(stack.time_scale, time_scale_note)],
    }
    doc = build_document("envelope", results, envelope.targets(), envelope.settings, command, extra)
    ok = add_ratios(doc, bounds)
    return doc, ok


def _targets_sentence(topology: Topology) -> str:
    adaptive = (
        ", `adaptive` is one server that speculates only at low batch sizes (SGLang `--speculative-adaptive` style)"
        if topology == "colocated"
        else ""
    )
    return (
        "Targets: `eagle` and `plain` are the simulated SGLang servers called directly; `specgate` is the gateway "
        f"in front of those same two servers{adaptive}."
    )


def _scale_sentence(scale: float, note: str) -> str:
    return (
        f"Simulator time scale {scale:g} ({note}): every modelled duration is multiplied by it, "
        "so absolute tok/s are the model's divided by it; ratios between targets are unaffected."
    )
