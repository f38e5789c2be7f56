"""specgate's policy is fed exactly what the gateway would feed it: the Completion built from a Slot over the same timeline."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from backends.sim.settings import SimSettings
from gateway.policies import Completion, Decision, Prompt, Running
from gateway.policies.static import ThresholdPolicy
from gateway.pool.backends import Backend, Health, Pool
from gateway.pool.snapshot import PoolSnapshot
from gateway.tiers import DEFAULT, Tier
from loadtest.envelope.fair import SUBJECT, Hardware
from loadtest.records import RequestRecord, RequestSpec
from loadtest.sweep import Level, RequestsPerLevel, SweepSettings
from vnode.clients import run_plan
from vnode.envelope import QuietProgress, warm_up_plan
from vnode.events import ARRIVAL, EventQueue
from vnode.gateway_router import BackendSpec, GatewayRouter
from vnode.node import Node
from vnode.requests import Request
from vnode.targets import TargetSpec, same_hardware_targets


def expected_completions(records: list[RequestRecord], backends: list[tuple[str, bool, str]]) -> list[Completion]:
    """What gateway/proxy/exchange.py would learn from these streams: a fresh pool on the records' clock,
    a slot per request from its send to its end, a token mark per chunk, the decode window at the end."""
    clock = [0.0]
    pool = Pool([Backend(n, "x", s, group=g, health=Health.READY) for n, s, g in backends], clock=lambda: clock[0])
    events: list[tuple[float, int, int, Callable[[], None]]] = []
    learned: list[Completion] = []

    def stream(record: RequestRecord) -> None:
        assert record.backend is not None and record.completion_tokens is not None
        slot = pool.acquire(record.backend, record.expected_output)
        for at in record.chunk_times:
            heapq.heappush(events, (at, 0, len(events), lambda at=at: slot.mark_token(at)))

        def end() -> None:
            window = slot.decode_window()
            tokens = record.completion_tokens or 0
            if tokens >= 2 and window is not None:
                learned.append(Completion(record.backend or "", tokens, record.chunk_times[0] - record.start,
                                          window.seconds, window.mean_inflight, window.mean_group_inflight,
                                          len(record.chunk_times)))
            slot.release()

        assert record.end is not None
        heapq.heappush(events, (record.end, 0, len(events) + 10**9, end))  # after its own last chunk

    for record in records:
        heapq.heappush(events, (record.start, 1, len(events), lambda record=record: stream(record)))
    while events:
        clock[0], _, _, action = heapq.heappop(events)
        action()
    return learned


def key(c: Completion) -> tuple[str, float, float]:
    return c.backend, round(c.ttft, 9), round(c.decode_seconds, 9)


def specgate_of(settings: SweepSettings) -> TargetSpec:
    """specgate on two co-located groups of 4 field-8gpu GPUs, moving no stream (a moved stream's response is
    learned from its last segment, which a slot per request does not follow)."""
    hardware = Hardware(2, 4, eagle_mem_fraction=0.4)
    _, targets = same_hardware_targets("field-8gpu", None, hardware, settings, QuietProgress(),
                                       policy_params={"adaptive_move_running": False})
    return next(t for t in targets if t.name == SUBJECT)


def recording(router: GatewayRouter) -> list[Completion]:
    """The completions `router`'s policy learns from now on, in order."""
    observed: list[Completion] = []
    learn = router.policy.observe

    def observe(completion: Completion) -> None:
        observed.append(completion)
        learn(completion)

    router.policy.observe = observe  # type: ignore[method-assign]
    return observed


def test_the_policy_learns_the_completions_a_slot_driven_gateway_would_build() -> None:
    levels = tuple(Level(concurrency=c) for c in (1, 2, 4, 8))
    settings = SweepSettings(levels=levels, requests_per_level=RequestsPerLevel(3, True, 8), input_len=64, output_len=32)
    specgate = specgate_of(settings)
    node = specgate.node(EventQueue())
    router = node.router
    assert isinstance(router, GatewayRouter)
    observed = recording(router)
    records: list[RequestRecord] = []
    warm = warm_up_plan(settings)
    assert warm is not None
    for plan in (warm, *settings.plans()):
        records += run_plan(node, plan).records
    assert all(r.ok for r in records) and {r.backend for r in records} >= {"g0-plain", "g1-plain"}
    gateway = specgate.gateway
    assert gateway is not None
    expected = expected_completions(records, [(b.name, b.speculative, b.group) for b in gateway.backends])
    assert len(observed) == len(expected) == len(records)
    for mine, theirs in zip(sorted(observed, key=key), sorted(expected, key=key), strict=True):
        assert mine.backend == theirs.backend and mine.output_tokens == theirs.output_tokens
        assert mine.token_chunks == theirs.token_chunks
        assert (mine.ttft, mine.decode_seconds, mine.mean_inflight, mine.mean_group_inflight) == pytest.approx(
            (theirs.ttft, theirs.decode_seconds, theirs.mean_inflight, theirs.mean_group_inflight), rel=1e-9, abs=1e-12)
    # Co-located groups: some responses decoded while their partner server had requests too.
    assert any(c.mean_group_inflight > c.mean_inflight for c in observed)


def test_the_gateway_s_ttft_spans_the_hop_both_ways() -> None:
    """The request path lies between the gateway and its servers: the TTFT its policy learns is the client's."""
    settings = SweepSettings(levels=(Level(concurrency=1),), requests_per_level=RequestsPerLevel(4), input_len=64,
                             output_len=32, warmup=0)
    node = specgate_of(settings).node(EventQueue(), hop=0.003)
    router = node.router
    assert isinstance(router, GatewayRouter)
    observed = recording(router)
    (plan,) = settings.plans()
    records = run_plan(node, plan).records  # one at a time: each completion is learned before the next is sent
    assert all(r.ok for r in records) and len(observed) == len(records) == 4
    assert [c.ttft for c in observed] == pytest.approx([r.ttft for r in records], rel=1e-9)


def test_a_response_with_nothing_cached_where_a_hold_was_predicted_lowers_the_trust() -> None:
    """As the exchange reads SGLang's usage (`--enable-cache-report`: a count, 0 included): a prefix the map
    predicted held but evicted whole teaches as a partial hit does."""
    backends = [BackendSpec("g0-eagle", True, "g0"), BackendSpec("g0-plain", False, "g0")]
    router = GatewayRouter(ThresholdPolicy(100), backends, lambda: 0.0, inflight_limit=100, flex_share=0.5)
    spec = RequestSpec("what is this " * 30, 90, 8, system="a system prompt " * 60)
    first, evicted = (Request.of(rid, spec) for rid in ("first", "evicted"))
    assert router.route(first, 0.0) == 0  # EAGLE below the threshold: the map has its prefix there from now on
    router.finish(first, 0.1, 8)
    trust = router.prefix_estimate.trust
    assert trust[0] == 1.0
    router.route(evicted, 0.2)
    router.finish(evicted, 0.3, 8, cached_tokens=0)
    assert trust[0] < 1.0  # the map predicted the prompt held there, and the server reported none of it


def pair_routed_by(policy: ThresholdPolicy, profile: Path) -> tuple[EventQueue, Node, list[Completion]]:
    """A co-located EAGLE + plain pair on one GPU (`profile`'s steps) routed by a gateway with `policy`; the
    completions its policy learns."""
    events = EventQueue()
    backends = [BackendSpec("g0-eagle", True, "g0"), BackendSpec("g0-plain", False, "g0")]
    router = GatewayRouter(policy, backends, lambda: events.now, inflight_limit=100, flex_share=0.5)
    sim = SimSettings(colocated=True, eagle_port=[0], plain_port=[0], profile="llama8b-h100", profile_file=profile)
    node = TargetSpec("test", sim).node(events, router)
    return events, node, recording(router)


class HandingOver(ThresholdPolicy):
    """Every request starts on the plain server and is handed over to EAGLE after its first token."""

    move_running = True

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        return Decision("g0-plain", "test_handover", tier, then="g0-eagle")


def test_a_handed_over_response_teaches_what_eagle_did_after_the_first_token(round_profile: Path) -> None:
    """As the exchange feeds it: EAGLE's own chunks, from its first one to the end, the whole answer's output,
    the token plain gave it, and no prompt (EAGLE was given it again with that token)."""
    events, node, observed = pair_routed_by(HandingOver(100), round_profile)
    done: list[RequestRecord] = []
    events.at(0.0, ARRIVAL, node.submit, RequestSpec(" ".join(["word"] * 20), 20, output_len=9), done.append)
    events.run()
    (record,), (learned,) = done, observed
    assert record.completion_tokens == 9
    given = len(record.chunk_texts[0].split())
    assert (learned.backend, learned.output_tokens, learned.given, learned.prompt_tokens) == ("g0-eagle", 9, given, 0)
    assert given == 1 and learned.token_chunks == len(record.chunk_times) - 1
    eagle_first, last = record.chunk_times[1], record.chunk_times[-1]
    assert (learned.ttft, learned.decode_seconds) == pytest.approx((eagle_first - record.start, last - eagle_first))


class MovingAll(ThresholdPolicy):
    """The first request goes to EAGLE, the next to plain, taking every running stream with it."""

    move_running = True

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        busy = any(v.inflight for v in snapshot.backends)
        return Decision("g0-plain" if busy else "g0-eagle", "test_move", tier)

    def may_move(self, decision: Decision) -> bool:
        return decision.backend == "g0-plain"

    def moves(self, snapshot: PoolSnapshot, decision: Decision, running: Sequence[Running]) -> list[str]:
        return [r.key for r in running]


def moved_by_a_switch(profile: Path, at: float) -> tuple[RequestRecord, GatewayRouter, list[Completion]]:
    """A 13-token answer on EAGLE that a 3-token request arriving `at` seconds later moves to plain: the
    answer's record, the router and what its policy learned."""
    events, node, observed = pair_routed_by(MovingAll(100), profile)
    moved: list[RequestRecord] = []
    words = " ".join(["word"] * 20)
    events.at(0.0, ARRIVAL, node.submit, RequestSpec(words, 20, output_len=13), moved.append)
    events.at(at, ARRIVAL, node.submit, RequestSpec(words, 20, output_len=3), lambda _: None)
    events.run()
    assert isinstance(node.router, GatewayRouter)
    return moved[0], node.router, observed


def test_a_response_moved_mid_answer_teaches_nothing(round_profile: Path) -> None:
    """As the exchange: its rest decoded while a switch drained, its life spans both modes."""
    moved, _, observed = moved_by_a_switch(round_profile, 0.010)  # after EAGLE's first chunks
    assert moved.completion_tokens == 13 and len(moved.chunk_texts[-1].split()) == 1  # it did move: plain's chunks
    assert [(c.backend, c.output_tokens) for c in observed] == [("g0-plain", 3)]


def test_a_response_moved_before_its_first_token_is_answered_where_it_moved_and_teaches_nothing(round_profile: Path) -> None:
    """As the exchange: sent whole to plain with the switch, its window holds the switch's prefills."""
    moved, router, observed = moved_by_a_switch(round_profile, 0.0)  # before its first token
    assert moved.completion_tokens == 13 and {len(t.split()) for t in moved.chunk_texts} == {1}  # plain's, all
    assert [(c.backend, c.output_tokens) for c in observed] == [("g0-plain", 3)]
    assert {b.name: b.inflight for b in router.pool} == {"g0-eagle": 0, "g0-plain": 0}
