"""The ways of running the same K x G GPUs, built from the very configuration the real-time envelope starts.

`plain-dp`, `eagle-dp` and `adaptive-dp` are K simulated servers of one role, each on its own GPUs,
behind the least-in-flight balancer, and (`routers` with "smg") `plain-dp+smg`, ... the same servers
behind the emulation of SMG's cache_aware policy (`vnode.smg_router`); `specgate` is K co-located
EAGLE + plain groups routed by the gateway's policy. Each target's servers come from the simulator argv the real-time envelope
(`loadtest.envelope.fair.FairEnvelope`) would run: the baselines' from `FairEnvelope.sim_argv`,
specgate's from the launch plan of its generated config (`build_plan`: groups, memory split, the
EAGLE servers' running cap), read back by the simulator's own option parser and laid out by its
own `plan_layout`, each server's engine core built by `backends.sim.layout.engine_core`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from backends.plan import build_plan
from backends.sim.core import EngineCore
from backends.sim.cli import read_settings
from backends.sim.layout import engine_core, plan_layout
from backends.sim.profiles import Profile, load_profile
from backends.sim.settings import SimSettings
from backends.sim.tokenizer import PseudoText
from gateway.config import PolicyConfig, Settings
from gateway.policies.factory import make_policy
from loadtest.envelope.baselines import Router as RouterKind
from loadtest.envelope.fair import SUBJECT, FairEnvelope, Hardware
from loadtest.envelope.smg import Smg
from loadtest.envelope.harness import StackSettings
from loadtest.sweep import Progress, SweepSettings
from vnode.draws import RequestDraws
from vnode.events import EventQueue
from vnode.gateway_router import BackendSpec, GatewayRouter
from vnode.gpu import Gpu, Server
from vnode.node import Node
from vnode.router import EngineWatcher, LeastInFlightRouter, Router
from vnode.smg_router import SmgCacheAwareRouter, SmgSettings

_SIM_MODULE_ARGS = 3  # `python -m backends.sim` before a simulator's own options
# What the harness is told runs the `+smg` targets: the emulation, under the version it follows.
EMULATED_SMG = Smg("vnode.smg_router (emulation)", "1.13.0")
Draws = Literal["server", "request"]


@dataclass(frozen=True)
class Gateway:
    """What specgate routes with: its backends in the pool's order, its policy and admission limits."""

    backends: tuple[BackendSpec, ...]
    policy: PolicyConfig
    inflight_limit: int


@dataclass(frozen=True)
class TargetSpec:
    """One target: its name, the simulator settings its servers run with, and specgate's gateway (None: a
    baseline, behind the least-in-flight balancer, or behind SMG's cache_aware policy where `smg` is set)."""

    name: str
    sim: SimSettings
    gateway: Gateway | None = None
    smg: SmgSettings | None = None

    def node(
        self, events: EventQueue, router: Router | None = None, draws: Draws = "server", hop: float = 0.0,
        taught: tuple[int, int] | None = None,
    ) -> Node:
        """A fresh node of this target on `events`' clock: idle servers, empty caches, a policy that knows nothing.

        `router` replaces the target's own (the balancer, or specgate's gateway); `draws`: "server", the
        simulator's own acceptance draws, or "request", each request's own (`vnode.draws`); `hop`: seconds
        between the clients and the servers, each way (`vnode.node`), which specgate's gateway's TTFTs span
        (`vnode.gateway_router`); `taught`: (prompt, output tokens) for specgate's policy to start knowing its
        servers' curves at those lengths (`GatewayRouter.teach`, a what-if; baselines ignore it).
        """
        profile = _profile(self.sim)
        slots = plan_layout(self.sim, profile)
        text = _text(self.sim.seed)
        names = [b.name for b in self.gateway.backends] if self.gateway else [f"{self.name}-{i}" for i in range(len(slots))]
        cores: list[EngineCore] = []  # in the router's index order
        router = router or self._router(names, lambda: events.now, hop)
        node = Node(events, router, text, profile.context_length, names if self.gateway else [None] * len(names), hop)
        gpus: dict[int, Gpu] = {}
        for index, (slot, name) in enumerate(zip(slots, names, strict=True)):
            gpu = gpus.setdefault(slot.group, Gpu(events))
            core = engine_core(self.sim, profile, slot, index, text)
            cores.append(core)
            if draws == "request":
                core.steps = RequestDraws(core.table, self.sim.seed, core.steps.target)
            node.add_server(Server(name, core, gpu, node.deliver))
        if isinstance(router, EngineWatcher):
            router.engines_attached(cores)
        if isinstance(router, GatewayRouter) and taught is not None:
            router.teach(*taught)
        return node

    def _router(self, names: list[str], clock: Callable[[], float], hop: float) -> Router:
        gateway = self.gateway
        if gateway is None and self.smg is not None:
            return SmgCacheAwareRouter(len(names), self.smg, seed=self.sim.seed)
        if gateway is None:
            return LeastInFlightRouter(names)
        return GatewayRouter(make_policy(gateway.policy), gateway.backends, clock, inflight_limit=gateway.inflight_limit,
                             flex_share=gateway.policy.tier_flex_inflight_share, hop=hop)


@lru_cache(maxsize=8)  # read-only once built, and 20 ms to build: every node of a process shares its seed's
def _text(seed: int) -> PseudoText:
    return PseudoText(seed)


def _profile(sim: SimSettings) -> Profile:
    return load_profile(sim.profile, sim.profile_file)


def same_hardware_targets(
    profile: str | None,
    profile_file: Path | None,
    hardware: Hardware,
    settings: SweepSettings,
    progress: Progress,
    policy: str = "adaptive",
    policy_params: dict[str, Any] | None = None,
    routers: tuple[RouterKind, ...] = ("least-inflight",),
    smg: SmgSettings = SmgSettings(),
) -> tuple[FairEnvelope, list[TargetSpec]]:
    """The real-time envelope's harness for these settings (unstarted: its config, comparison, words) and the
    model's targets, baselines first, as it runs them; `routers` as the real envelope's (ValueError: "smg" with
    K=1), the `+smg` targets behind the emulation with `smg`."""
    stack = StackSettings(profile, profile_file, "colocated" if hardware.groups == 1 else "groups", policy,
                          dict(policy_params or {}), time_scale=1.0, seed=settings.seed)
    fair = FairEnvelope(stack, hardware, settings, Path("."), progress, routers,
                        EMULATED_SMG if "smg" in routers else None)
    if "smg" in routers:
        fair.smg_policy = f"emulated: {smg.describe()}"
    targets = [TargetSpec(name, _read(fair.sim_argv(name)), smg=smg if b.router == "smg" else None)
               for name, b in fair.baselines.items()]
    gateway_settings = Settings.model_validate(fair.config)
    policy_config = gateway_settings.resolved_policy
    plan = build_plan(gateway_settings.launch, eagle_cap=policy_config.eagle_cap, free_port=lambda: 0)
    (process,) = plan.processes  # the simulator serves every co-located group from one process
    backends = tuple(BackendSpec(ep.backend, ep.speculative, ep.group) for ep in process.endpoints)
    gateway = Gateway(backends, policy_config, gateway_settings.limits.max_inflight)
    targets.append(TargetSpec(SUBJECT, _read(process.argv), gateway))
    return fair, targets


def _read(argv: tuple[str, ...]) -> SimSettings:
    return read_settings(argv[_SIM_MODULE_ARGS:])
