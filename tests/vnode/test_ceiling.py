"""The static ceiling: specgate's layout pinned to one mode assignment, each level judged by the cell's bounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from backends.sim.request import RequestError
from vnode.ceiling import Static, assignments, pinned_servers, static_router, statics
from vnode.cli import main
from vnode.gateway_router import BackendSpec
from vnode.requests import Request


def _backends(groups: int) -> list[BackendSpec]:
    return [BackendSpec(f"g{g}-{kind}", kind == "eagle", f"g{g}") for g in range(groups) for kind in ("eagle", "plain")]


def test_each_assignment_pins_the_servers_of_its_modes() -> None:
    two, four = _backends(2), _backends(4)
    assert [two[i].name for i in pinned_servers(two, "eagle")] == ["g0-eagle", "g1-eagle"]
    assert [two[i].name for i in pinned_servers(two, "plain")] == ["g0-plain", "g1-plain"]
    assert [two[i].name for i in pinned_servers(two, "split")] == ["g0-eagle", "g1-plain"]
    assert [four[i].name for i in pinned_servers(four, "split")] == ["g0-eagle", "g1-eagle", "g2-plain", "g3-plain"]
    assert assignments(1) == ("eagle", "plain") and assignments(2) == ("eagle", "plain", "split")


def test_a_pinned_router_balances_over_its_servers_only() -> None:
    router = static_router(_backends(2), Static("plain"))
    requests = [Request(f"r{i}", (), [1, 2, 3], "k", 4) for i in range(4)]
    chosen = [router.route(r, 0.0) for r in requests]
    assert sorted(chosen) == [1, 1, 3, 3]  # least in flight: two each, never an EAGLE server
    router.finish(requests[0], 1.0, 4)
    router.finish(requests[2], 1.0, 4)
    assert router.route(Request("r4", (), [1], "k", 4), 1.0) == chosen[0]  # the freed one first (ties rotate)


@dataclass
class _Engine:
    """What SMG's load poll reads of an engine core."""

    uncached: int
    waiting: tuple[()] = ()
    running: tuple[()] = ()
    table: Any = field(default_factory=lambda: type("Table", (), {"max_total_tokens": 1000})())

    def waiting_uncached_tokens(self) -> int:
        return self.uncached

    def used_tokens(self) -> int:
        return 0

    def gen_throughput(self, now: float) -> float:
        return 1000.0

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        pass  # holds anything


@dataclass
class _Room:
    """What the pinned router reads of an engine core to place a request no allowed server holds."""

    capacity: int
    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if prompt_tokens + max_new_tokens > self.capacity:
            raise RequestError("exceeds the server's KV cache capacity")


def test_a_pinned_smg_router_reads_and_routes_to_its_servers_only() -> None:
    """Plain behind SMG on two groups: the EAGLE servers' engines (no load report here) are never polled, the
    plain server with the shorter queue wins the first request, and the next with its text follows it."""
    router = static_router(_backends(2), Static("plain", "smg"))
    router.engines_attached([_Room(10_000), _Engine(uncached=50_000), _Room(10_000), _Engine(uncached=0)])  # type: ignore[list-item]
    text = "a long shared system prompt, then a question"
    first = router.route(Request("r0", (("user", text),), [1, 2, 3], text, 4), 0.0)
    again = router.route(Request("r1", (("user", text + " more"),), [1, 2, 3], text + " more", 4), 0.0)
    assert (first, again) == (3, 3)
    assert [s.label for s in statics(2, ("least-inflight", "smg"))] == [
        "eagle", "plain", "split", "eagle+smg", "plain+smg", "split+smg"]


def test_a_request_no_pinned_server_holds_goes_to_the_least_loaded_server_that_does() -> None:
    """Every group speculating, on EAGLE servers of 1,000 tokens beside plain ones of 10,000: a long prompt goes to
    the idler plain server, outside the balancer's count; the short ones keep alternating over the EAGLE servers."""
    router = static_router(_backends(2), Static("eagle"))
    router.engines_attached([_Room(1_000), _Room(10_000, running=["a", "b"]), _Room(1_000), _Room(10_000)])  # type: ignore[list-item]
    long = Request("long", (), list(range(5_000)), "k", 8)
    assert router.route(long, 0.0) == 3
    short = [Request(f"s{i}", (), [1, 2, 3], "k", 8) for i in range(3)]
    assert [router.route(r, 0.0) for r in short[:2]] == [0, 2]
    router.finish(long, 1.0, 8)
    router.finish(short[0], 1.0, 8)
    assert router.route(short[2], 1.0) == 0  # the balancer freed the one it counted, not the long prompt's

    # Half the groups each: the balancer's turn falls on g0's EAGLE server, which cannot hold the prompt, so it
    # goes to the plain server of g1 that can, and the balancer's count of it ends at once.
    split = static_router(_backends(2), Static("split"))
    split.engines_attached([_Room(1_000), _Room(10_000), _Room(1_000), _Room(10_000)])  # type: ignore[list-item]
    assert split.route(Request("long", (), list(range(5_000)), "k", 8), 0.0) == 3
    assert sorted(split.route(r, 0.0) for r in short[:2]) == [0, 3]


def test_the_ceiling_names_the_assignment_that_meets_each_level(tmp_path: Path) -> None:
    """Crossover 8 on one group, closed loop: EAGLE alone meets the levels below the crossover, plain alone from
    it on; a router that ignored the assignment would give both the same verdicts."""
    out, markdown = tmp_path / "ceiling.json", tmp_path / "ceiling.md"
    result = CliRunner().invoke(main, ["family-ceiling", "--members", "x8-s2-line-k1", "--workloads", "closed",
                                       "--jobs", "1", "--out", str(out), "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    (cell,) = orjson.loads(out.read_bytes())["cells"]
    met_by = {lv["label"]: lv["met_by"] for lv in cell["levels"]}
    assert met_by == {"C=1": ["eagle"], "C=2": ["eagle"], "C=4": ["eagle"], "C=8": ["plain"], "C=16": ["plain"],
                      "C=32": ["plain"], "C=64": ["plain"], "C=128": ["plain"], "C=256": ["plain"]}
    assert cell["attainable"] and cell["one_assignment"] == []
    expected = "met" if cell["specgate"] else "policy"
    assert f"x8-s2-line-k1 closed: {expected}" in result.output
    report = markdown.read_text()
    assert "python -m vnode family-ceiling --members x8-s2-line-k1" in report and f"| x8-s2-line-k1 | {expected} |" in report
