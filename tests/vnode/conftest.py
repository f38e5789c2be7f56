"""A profile with round numbers, so a test can compute the model's timeline by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.settings import SimSettings
from vnode.events import EventQueue
from vnode.node import Node
from vnode.router import Router
from vnode.targets import TargetSpec

# Plain: 2 ms + 0.5 ms per running request. EAGLE: 3 ms + 1 ms per request, always 4 tokens a step
# (tau = num_draft_tokens: every draft token accepted). Prefill 0.01 ms per uncached prompt token.
ROUND_NUMBERS = {
    "plain": {"t0_ms": 2.0, "per_request_ms": 0.5, "prefill_ms_per_token": 0.01},
    "eagle": {"t0_ms": 3.0, "per_request_ms": 1.0, "tau": 4.0, "num_draft_tokens": 4, "prefill_ms_per_token": 0.01},
}


@pytest.fixture
def round_profile(tmp_path: Path) -> Path:
    """`llama8b-h100` (its memory: a co-located server holds about 111k tokens) with ROUND_NUMBERS' steps."""
    path = tmp_path / "round.json"
    path.write_text(json.dumps(ROUND_NUMBERS))
    return path


def replicas(role: str, count: int, profile_file: Path) -> SimSettings:
    """`count` servers of `role`, each on its own GPU."""
    return SimSettings(role=role, port=[0] * count, profile="llama8b-h100", profile_file=profile_file)


def colocated(profile_file: Path) -> SimSettings:
    """One co-located EAGLE + plain group on one GPU (server 0 is EAGLE, 1 plain)."""
    return SimSettings(colocated=True, eagle_port=[0], plain_port=[0], profile="llama8b-h100", profile_file=profile_file)


def node_of(sim: SimSettings, router: Router | None = None) -> Node:
    """A fresh node of these servers on a clock at 0 (the balancer unless `router` is given)."""
    return TargetSpec("test", sim).node(EventQueue(), router)
