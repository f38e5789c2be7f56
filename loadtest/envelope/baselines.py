"""The same-hardware envelope's baselines: each mode's K servers, behind which router, under which name.

A baseline runs K data-parallel servers of one mode (`plain-dp`, `eagle-dp`, `adaptive-dp`) behind
a router a user would put in front of them: the least-in-flight balancer (`balancer.py`, what
nginx's `least_conn` does), or the real SMG router with its cache_aware policy (`smg.py`), whose
targets are named `plain-dp+smg`, ... `--baseline-router` picks one router or both; by default both
where the workload shares prefixes (what cache-aware routing is for), the balancer alone
otherwise. With K=1 there is nothing to route: the load goes to the one server directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Router = Literal["least-inflight", "smg"]
# `--baseline-router` choices, and the routers each runs.
ROUTER_CHOICES: dict[str, tuple[Router, ...]] = {
    "least-inflight": ("least-inflight",),
    "smg-cache-aware": ("smg",),
    "both": ("least-inflight", "smg"),
}
# Each mode's target name and the simulator role its servers run.
MODES = {"plain-dp": "plain", "eagle-dp": "eagle", "adaptive-dp": "adaptive"}
# Datasets whose requests share prefixes (system prompts, conversation histories, trace blocks).
PREFIX_DATASETS = frozenset({"shared-prefix", "multi-turn", "trace"})
SMG_SUFFIX = "+smg"


@dataclass(frozen=True)
class Baseline:
    """One baseline target: a mode's K servers (simulator `role`) behind `router`."""

    mode: str
    role: str
    router: Router

    @property
    def name(self) -> str:
        """The target's name: the mode, with `+smg` behind SMG."""
        return self.mode + (SMG_SUFFIX if self.router == "smg" else "")


def baselines(routers: Sequence[Router]) -> tuple[Baseline, ...]:
    """Every mode behind every router, mode by mode: `plain-dp`, `plain-dp+smg`, `eagle-dp`, ..."""
    return tuple(Baseline(mode, role, router) for mode, role in MODES.items() for router in routers)


def default_router_choice(dataset: str, groups: int) -> str:
    """`both` for a workload that shares prefixes on K > 1 replicas, else `least-inflight`."""
    return "both" if groups > 1 and dataset in PREFIX_DATASETS else "least-inflight"
