"""The emulation of SMG's cache_aware policy: its tree, its decisions on hand-made cases, and the `+smg` targets."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from loadtest.envelope.fair import Hardware
from loadtest.workloads.multi_turn import MultiTurn
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings
from vnode.envelope import EnvelopeSpec, run_envelope
from vnode.requests import Request
from vnode.smg_router import SmgCacheAwareRouter, SmgSettings, TextTree


@dataclass
class _Table:
    max_total_tokens: int = 1000


@dataclass
class FakeCore:
    """What a load poll reads of an engine core."""

    waiting: deque[Any] = field(default_factory=deque)
    running: dict[str, Any] = field(default_factory=dict)
    table: _Table = field(default_factory=_Table)
    uncached: int = 0
    throughput: float = 0.0

    def waiting_uncached_tokens(self) -> int:
        return self.uncached

    def used_tokens(self) -> int:
        return 0

    def gen_throughput(self, now: float) -> float:
        return self.throughput


def request(rid: str, text: str) -> Request:
    return Request(rid, (("user", text),), [1, 2, 3], text, 8)


def router(cores: list[FakeCore], **settings: Any) -> SmgCacheAwareRouter:
    smg = SmgCacheAwareRouter(len(cores), SmgSettings(**settings))
    smg.engines_attached(cores)  # type: ignore[arg-type]
    return smg


def test_the_tree_matches_the_longest_prefix_and_names_its_holders() -> None:
    tree = TextTree(range(3))
    tree.insert("system prompt: be brief. question one", 0)
    tree.insert("system prompt: be brief. question two", 1)
    tree.insert("another prompt", 2)
    assert tree.match("system prompt: be brief. question one, again") == (37, {0})
    assert tree.match("system prompt: be brief. q") == (26, {0, 1})
    assert tree.match("system prompt: be kind") == (18, {0, 1})
    assert tree.match("nothing alike") == (0, {0, 1, 2})


def test_a_high_match_goes_to_the_holder_although_another_is_less_loaded() -> None:
    cores = [FakeCore(), FakeCore()]
    r = router(cores)
    prompt = "a long shared system prompt " * 20
    first = r.route(request("a", prompt + "first question"), 0.0)
    again = [r.route(request(f"b{i}", prompt + f"question {i}"), 0.1) for i in range(5)]
    assert again == [first] * 5 and r.inflight[first] == 6 and r.inflight[1 - first] == 0


def test_a_low_match_goes_to_the_shortest_expected_wait() -> None:
    cores = [FakeCore(uncached=50_000), FakeCore()]  # worker 0 reports a long prefill queue
    r = router(cores)
    r.route(request("warm", "x"), 0.0)  # the first decision polls the loads
    r.inflight = [0, 0]
    decisions = [r.route(request(f"r{i}", f"{i} unrelated text number {i}"), 1.0) for i in range(4)]
    assert decisions == [1, 1, 1, 1]  # 25 s of queue on worker 0 outweighs 4 credited dispatches on worker 1


def test_misses_water_fill_by_since_poll_credit_on_an_idle_fleet() -> None:
    cores = [FakeCore(), FakeCore(), FakeCore()]
    r = router(cores)
    decisions = [r.route(request(f"r{i}", f"{i}" * 10), 0.0) for i in range(6)]
    assert sorted(decisions) == [0, 0, 1, 1, 2, 2]  # each dispatch credits its worker until the next poll


def test_an_imbalanced_holder_spills_to_the_least_loaded() -> None:
    cores = [FakeCore(), FakeCore()]
    r = router(cores, balance_abs_threshold=1, balance_rel_threshold=1.5)
    prompt = "shared prefix " * 30
    holder = r.route(request("h", prompt + "q"), 0.0)
    for i in range(2):  # 2 in flight against a mean of 1 does not trip the gate (not above mean + 1)
        r.route(request(f"x{i}", prompt + f"q{i}"), 0.0)
    assert r.inflight == ([3, 0] if holder == 0 else [0, 3])  # 3 against 1.5 does
    spilled = r.route(request("s", prompt + "q9"), 0.0)
    assert spilled == 1 - holder
    assert r.tree.match(prompt + "q")[1] == {0, 1}  # the spill target now holds the prefix too


def test_overloaded_workers_are_passed_over() -> None:
    cores = [FakeCore(), FakeCore()]
    cores[0].waiting.extend(range(8))  # 8 waiting requests: SMG's overload veto
    r = router(cores)
    prompt = "p" * 100
    assert [r.route(request(f"r{i}", prompt), 0.0) for i in range(3)] == [1, 1, 1]


def test_finish_releases_the_in_flight_count() -> None:
    r = router([FakeCore(), FakeCore()])
    req = request("a", "hello")
    index = r.route(req, 0.0)
    r.finish(req, 1.0, 8)
    assert r.inflight[index] == 0


def test_an_envelope_with_both_routers_has_the_smg_targets() -> None:
    settings = SweepSettings(levels=(Level(request_rate=8.0),), requests_per_level=RequestsPerLevel(12, False, 12),
                             input_len=64, output_len=16, dataset=MultiTurn(turns=2, system_prompt_len=128))
    doc = run_envelope(EnvelopeSpec(Hardware(2, 1), settings, profile="llama8b-h100",
                                    routers=("least-inflight", "smg")))
    (level,) = doc.levels
    assert list(level.targets) == ["plain-dp", "plain-dp+smg", "eagle-dp", "eagle-dp+smg", "adaptive-dp",
                                   "adaptive-dp+smg", "specgate"]
    assert {t.stats.completed for t in level.targets.values()} == {level.requests}
    assert doc.stack["baseline_routers"] == ["least-inflight", "smg"] and doc.stack["smg"]["emulated"]
