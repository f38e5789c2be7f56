"""The same-hardware envelope: specgate against the same GPUs run each other way, one target at a time.

K groups of G simulated GPUs are run four ways: `specgate` (`specgate serve` with K co-located
EAGLE + plain groups), `plain-dp` (K plain servers), `eagle-dp` (K EAGLE servers, with the running
cap specgate's EAGLE servers get) and `adaptive-dp` (K SGLang `--speculative-adaptive` servers).
The K servers of a baseline run as replicas of ONE simulator process (CPU is what 2 cores lack),
behind a router when K > 1: the least-in-flight balancer (`loadtest.envelope.balancer`), the real
SMG router with its cache_aware policy (`loadtest.envelope.smg`, targets `plain-dp+smg`, ...), or
each in turn (`baselines.py`). Each target's processes run only while that target is swept, so an
idle target costs nothing and every target meets cold caches; every target gets the same requests
at each level (the sweep draws them from the level's index and the seed).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import tomli_w

from backends.plan import build_plan
from backends.process import Child, free_loopback_port
from backends.readiness import wait_until_ready
from backends.resolve import EAGLE, PlanError, resolve_servers
from backends.sim_argv import SimCommon, SimServer, sim_argv
from gateway.config import Settings
from loadtest.envelope.baselines import Baseline, Router, baselines
from loadtest.envelope.comparison import CARRYING_WITHIN
from loadtest.envelope.harness import STARTUP_TIMEOUT, StackSettings, specgate_executable
from loadtest.envelope.smg import POLICY, Smg, policy_settings, wait_routing
from loadtest.monitor import CpuMeter, PidSource, descendants
from loadtest.results import LevelResult
from loadtest.slip import SlipProbe
from loadtest.sweep import Progress, Sweep, SweepSettings, Target
from loadtest.verdicts import Comparison

SUBJECT = "specgate"
HOST = "127.0.0.1"
Ready = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Hardware:
    """K groups of G GPUs each: what every target runs on; specgate's memory shares (None: the launcher's) and how
    many of its groups (the last ones) run a plain server alone, and how many (those before) an EAGLE server alone."""

    groups: int
    gpus_per_group: int
    eagle_mem_fraction: float | None = None
    plain_mem_fraction: float | None = None
    plain_only_groups: int = 0
    eagle_only_groups: int = 0

    @property
    def colocated_groups(self) -> int:
        """Groups running an EAGLE and a plain server side by side."""
        return self.groups - self.plain_only_groups - self.eagle_only_groups

    @property
    def servers(self) -> int:
        """specgate's servers: two per co-located group, one per one-mode group."""
        return self.groups + self.colocated_groups

    def gpu_sets(self) -> list[list[int]]:
        """Each group's GPU ids: [[0..G-1], [G..2G-1], ...]."""
        g = self.gpus_per_group
        return [list(range(i * g, (i + 1) * g)) for i in range(self.groups)]

    def __str__(self) -> str:
        return f"{self.groups} x {self.gpus_per_group} GPU" + ("s" if self.gpus_per_group > 1 else "")


def specgate_config(stack: StackSettings, hardware: Hardware, port: int) -> dict[str, Any]:
    """specgate's TOML config as a dict: K=1 is topology "colocated" on G GPUs, K > 1 "groups"."""
    gpus = hardware.gpu_sets()
    launch: dict[str, Any] = {"engine": "sim", "time_scale": stack.time_scale, "seed": stack.seed}
    eagle: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    if stack.eagle_max_running_requests:
        eagle["max_running_requests"] = stack.eagle_max_running_requests
    if hardware.eagle_mem_fraction is not None:
        eagle["mem_fraction_static"] = hardware.eagle_mem_fraction
    if hardware.plain_mem_fraction is not None:
        plain["mem_fraction_static"] = hardware.plain_mem_fraction
    if hardware.groups == 1:
        launch |= {"topology": "colocated", "eagle": eagle | {"gpus": gpus[0]}, "plain": plain | {"gpus": gpus[0]}}
    else:
        launch |= {"topology": "groups", "groups": gpus, "eagle": eagle, "plain": plain}
        if hardware.plain_only_groups:
            launch["plain_only_groups"] = hardware.plain_only_groups
        if hardware.eagle_only_groups:
            launch["eagle_only_groups"] = hardware.eagle_only_groups
    if stack.profile_file is not None:
        launch["profile_file"] = str(stack.profile_file)
    if stack.profile is not None:
        launch["profile"] = stack.profile
    return {
        "server": {"host": HOST, "port": port, "log_level": "warning"},
        "policy": {"name": stack.policy, **stack.policy_params},
        "launch": launch,
    }


def eagle_dp_cap(config: dict[str, Any]) -> int | None:
    """The running cap of specgate's EAGLE servers, derived as the launcher derives it.

    Also checks the plan: a group whose two copies of the weights do not fit raises PlanError here,
    before anything starts.
    """
    settings = Settings.model_validate(config)
    eagle_cap = settings.resolved_policy.eagle_cap
    build_plan(settings.launch, eagle_cap=eagle_cap)
    servers = resolve_servers(settings.launch, eagle_cap=eagle_cap)
    return next(s.max_running_requests for s in servers if s.role == EAGLE)


@dataclass(frozen=True)
class TargetProcesses:
    """One target's processes, each started once the one before is ready; where the load goes; its simulators."""

    name: str
    url: str
    steps: tuple[tuple[Child, Ready], ...]
    sim_urls: tuple[str, ...]  # empty: read them from the gateway once it runs
    cpu_groups: dict[str, PidSource]

    @property
    def children(self) -> tuple[Child, ...]:
        """Every process, in starting order."""
        return tuple(child for child, _ in self.steps)


class FairEnvelope:
    """Sweeps the data-parallel baselines behind each of `routers`, then specgate, on the same K x G GPUs."""

    def __init__(
        self,
        stack: StackSettings,
        hardware: Hardware,
        settings: SweepSettings,
        out_dir: Path,
        progress: Progress,
        routers: Sequence[Router] = ("least-inflight",),
        smg: Smg | None = None,
    ) -> None:
        if "smg" in routers and (smg is None or hardware.groups < 2):
            raise ValueError("SMG baselines need the SMG executable and K > 1 replicas to route between")
        self.stack = stack
        self.hardware = hardware
        self.settings = settings
        self.out_dir = out_dir
        self.progress = progress
        self.routers = tuple(routers)
        self.smg = smg
        self.smg_policy: str | None = None  # the policy settings SMG's log stated, once an SMG target started
        self.config_path = out_dir / "specgate.toml"
        self.gateway_port = free_loopback_port()
        self.config = specgate_config(stack, hardware, self.gateway_port)
        try:
            self.eagle_cap = eagle_dp_cap(self.config)
        except PlanError as exc:
            raise RuntimeError(f"specgate cannot run {hardware} on this profile: {exc}") from None
        self.baselines = {b.name: b for b in baselines(self.routers)}
        k = hardware.groups
        self.ports = {name: [free_loopback_port() for _ in range(k)] for name in self.baselines}
        self.router_ports = {name: free_loopback_port() for name in self.baselines} if k > 1 else {}

    def _url(self, name: str) -> str:
        if name == SUBJECT:
            return f"http://{HOST}:{self.gateway_port}"
        port = self.router_ports[name] if self.router_ports else self.ports[name][0]
        return f"http://{HOST}:{port}"

    def targets(self) -> list[Target]:
        """The baselines, then specgate (its plan was already checked, so a refusal came before anything ran)."""
        return [Target(name, self._url(name)) for name in (*self.baselines, SUBJECT)]

    def comparison(self) -> Comparison:
        """specgate against the best baseline, whichever router; TPOT only against those that carry the load."""
        return Comparison(SUBJECT, tuple(self.baselines), CARRYING_WITHIN, "same-hardware")

    def describe(self) -> str:
        """The report's sentences on what the targets are (with SMG's version and policy settings where it ran)."""
        h = self.hardware
        k = h.groups
        alone = [f"{n} {mode}-only" for n, mode in ((h.eagle_only_groups, "EAGLE-3"), (h.plain_only_groups, "plain")) if n]
        groups, servers = ("1 co-located EAGLE-3 + plain group", "1 server") if k == 1 else (
            f"{h.colocated_groups} co-located EAGLE-3 + plain groups" + (f" and {' and '.join(alone)}" if alone else ""),
            f"{k} servers")
        text = (
            f"Same hardware, {self.hardware} each way: `specgate` runs {groups} behind the gateway; `plain-dp`, "
            f"`eagle-dp` (running cap {self.eagle_cap}, as specgate's EAGLE servers) and `adaptive-dp` (SGLang "
            f"`--speculative-adaptive`) each run {servers} of one mode, {self._routed()}. Each target runs alone, its "
            "servers started before and stopped after its sweep, so each meets cold caches."
        )
        if self.smg is None or "smg" not in self.routers:
            return text
        settings = self.smg_policy or "not stated in its log"
        return text + (
            f" SMG {self.smg.version} (`smg launch --policy cache_aware`), every policy knob at SMG's default, as its "
            f"log states them: `{settings}`; health checks on the servers' `/health` at SMG's default interval."
        )

    def _routed(self) -> str:
        if self.hardware.groups == 1:
            return "called directly"
        return {
            ("least-inflight",): "behind a least-in-flight balancer",
            ("smg",): "behind the SMG router (`+smg`)",
        }.get(self.routers, "once behind a least-in-flight balancer and once behind the SMG router (`+smg`)")

    def layout(self) -> str:
        """The title's words for the hardware."""
        return f"same hardware {self.hardware}"

    def sim_argv(self, name: str) -> tuple[str, ...]:
        """The one simulator process of a baseline: K replicas of its role, each on G GPUs."""
        role = self.baselines[name].role
        first, *rest = self.ports[name]
        common = SimCommon(self.stack.profile, self.stack.profile_file, self.stack.time_scale, self.stack.seed)
        server = SimServer(role, HOST, first, max_running_requests=self.eagle_cap if role == EAGLE else None)
        extra = [arg for port in rest for arg in ("--port", str(port))]
        extra += ["--gpus-per-group", str(self.hardware.gpus_per_group)]
        return sim_argv(common, server, tuple(extra))

    def _processes(self, name: str) -> TargetProcesses:
        logs = self.out_dir / "logs"
        url = self._url(name)
        if name == SUBJECT:
            gateway = Child("gateway", [specgate_executable(), "serve", "--config", str(self.config_path)],
                            log_path=logs / "specgate.log")
            return TargetProcesses(name, url, ((gateway, lambda: wait_until_ready(url, gateway, STARTUP_TIMEOUT)),), (),
                                   {"gateway": lambda: [gateway.pid], "sims": lambda: descendants(gateway.pid)})
        sim = Child(name, self.sim_argv(name), log_path=logs / f"{name}.log")
        replicas = tuple(f"http://{HOST}:{p}" for p in self.ports[name])
        steps: list[tuple[Child, Ready]] = [(sim, lambda: replicas_ready(replicas, sim))]
        groups: dict[str, PidSource] = {"sims": lambda: [sim.pid]}
        if self.router_ports:
            router, ready = self._router(self.baselines[name], replicas, logs)
            steps.append((router, ready))
            groups["balancer"] = lambda: [router.pid]  # the baseline's router, whichever it is
        return TargetProcesses(name, url, tuple(steps), replicas, groups)

    def _router(self, baseline: Baseline, replicas: tuple[str, ...], logs: Path) -> tuple[Child, Ready]:
        """The process in front of a baseline's replicas, and how to tell it routes."""
        name, url, port = baseline.name, self._url(baseline.name), self.router_ports[baseline.name]
        if baseline.router == "least-inflight":
            argv = [sys.executable, "-m", "loadtest.envelope.balancer", "--host", HOST, "--port", str(port),
                    *(a for u in replicas for a in ("--upstream", u))]
            balancer = Child(f"{name}-balancer", argv, log_path=logs / f"{name}-balancer.log")
            return balancer, lambda: wait_until_ready(url, balancer, STARTUP_TIMEOUT)
        assert self.smg is not None
        smg = Child(f"{name}-router", self.smg.argv(HOST, port, free_loopback_port(), replicas),
                    log_path=logs / f"{name}-router.log")

        async def routing() -> None:
            await wait_routing(url, smg, len(replicas), STARTUP_TIMEOUT)
            self.smg_policy = self.smg_policy or policy_settings(smg.output())

        return smg, routing

    async def run(self, command: str) -> tuple[list[LevelResult], dict[str, Any]]:
        """Sweep each target in turn; returns the merged level results and what ran."""
        began = time.monotonic()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(tomli_w.dumps(self.config))
        per_target: list[list[LevelResult]] = []
        info: dict[str, Any] = {
            "groups": self.hardware.groups,
            "gpus_per_group": self.hardware.gpus_per_group,
            "eagle_mem_fraction": self.hardware.eagle_mem_fraction,
            "plain_mem_fraction": self.hardware.plain_mem_fraction,
            "plain_only_groups": self.hardware.plain_only_groups,
            "eagle_only_groups": self.hardware.eagle_only_groups,
            "eagle_dp_max_running_requests": self.eagle_cap,
            "baseline_routers": list(self.routers),
            "config": self.config,
            "servers": {},
            "target_seconds": {},
        }
        for target in self.targets():
            started = time.monotonic()
            per_target.append(await self._sweep(self._processes(target.name), info))
            info["target_seconds"][target.name] = time.monotonic() - started
        info["run_seconds"] = time.monotonic() - began
        if self.smg is not None and "smg" in self.routers:
            info["smg"] = {"executable": self.smg.executable, "version": self.smg.version, "policy": POLICY,
                           "policy_settings": self.smg_policy}
        return merge_levels(per_target), info

    async def _sweep(self, target: TargetProcesses, info: dict[str, Any]) -> list[LevelResult]:
        info["servers"][target.name] = [" ".join(c.argv) for c in target.children]
        try:
            for child, ready in target.steps:
                child.start()
                await ready()
            sim_urls = target.sim_urls
            if not sim_urls:
                status = await all_backends_ready(target.url, target.children[0], self.hardware.servers)
                info["gateway_status"] = status
                sim_urls = tuple(b["url"] for b in status["backends"])
            for child in target.children:
                child.note_descendants()
            cpu = CpuMeter(target.cpu_groups)
            async with SlipProbe(sim_urls) as slip:
                return await Sweep([Target(target.name, target.url)], self.settings, self.progress, cpu, slip).run()
        finally:
            for child in reversed(target.children):
                await child.stop()


def merge_levels(per_target: Sequence[Sequence[LevelResult]]) -> list[LevelResult]:
    """One LevelResult per level with every target's result, from one sweep per target."""
    return [
        replace(levels[0], targets={name: result for lv in levels for name, result in lv.targets.items()})
        for levels in zip(*per_target, strict=True)
    ]


async def all_backends_ready(gateway_url: str, gateway: Child, expected: int) -> dict[str, Any]:
    """Wait until the gateway's health checker sees all `expected` backends ready, so C=1 is not one-sided."""
    url = f"{gateway_url}/admin/status"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for _ in range(int(STARTUP_TIMEOUT / 0.2)):
            async with session.get(url) as resp:
                status = orjson.loads(await resp.read())
            backends = status["backends"]
            if len(backends) == expected and all(b["state"] == "ready" for b in backends):
                return status
            if not gateway.running:
                break
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the gateway never saw its {expected} backends ready; its last output:\n{gateway.last_lines()}")


async def replicas_ready(urls: Sequence[str], sim: Child) -> None:
    """Wait until every replica of one simulator process answers `/ready`."""
    for url in urls:
        await wait_until_ready(url, sim, STARTUP_TIMEOUT)
