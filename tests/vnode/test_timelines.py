"""The model against timelines computed by hand: one request alone, two co-located servers, a shared prefix, the balancer."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.records import RequestRecord, RequestSpec
from loadtest.stats import request_tpot
from vnode.events import ARRIVAL, EventQueue
from vnode.node import Node
from vnode.requests import Request
from vnode.router import DrainLook, LeastInFlightRouter
from vnode.targets import TargetSpec

from .conftest import colocated, node_of, replicas

WORDS = " ".join(["word"] * 20)  # 20 tokens; the chat template adds 7: 27 prompt tokens
MS = 1e-3


def send(node: Node, spec: RequestSpec, at: float = 0.0) -> list[RequestRecord]:
    """Submit `spec` at `at`; the list gets its record once it ended."""
    done: list[RequestRecord] = []
    node.events.at(at, ARRIVAL, node.submit, spec, done.append)
    return done


def test_one_request_alone_pays_its_prefill_in_its_first_step_then_one_step_per_token(round_profile: Path) -> None:
    node = node_of(replicas("plain", 1, round_profile))
    done = send(node, RequestSpec(WORDS, 20, output_len=5))
    node.events.run()
    (record,) = done
    first = (2.0 + 0.5 + 27 * 0.01) * MS  # the step at batch 1, plus the whole prompt's prefill
    assert record.prompt_tokens == 27 and record.cached_tokens == 0 and record.completion_tokens == 5
    assert record.ttft == pytest.approx(first)
    assert record.chunk_times == pytest.approx([first + k * 2.5 * MS for k in range(5)])
    assert request_tpot(record) == pytest.approx(2.5 * MS)
    assert record.answer == node.text.text(node.text.start_for(Request.of("r", RequestSpec(WORDS, 20, 5)).prompt_key), 0, 5)


def test_on_an_eagle_server_the_first_token_needs_the_prefill_and_one_target_step(round_profile: Path) -> None:
    node = node_of(replicas("eagle", 1, round_profile))
    done = send(node, RequestSpec(WORDS, 20, output_len=9))  # 1 + 4 + 4 tokens: three steps
    node.events.run()
    (record,) = done
    prefill = 27 * 0.01
    # SGLang's prefill batch on an EAGLE server: the target's forward, then the draft's extend; no verify
    # round comes before the first token. The joining step still lasts its EAGLE step plus the prefill,
    # and the request drafts from the next step on.
    first = 2.0 + 0.5 + prefill
    joined = 3.0 + 1.0 + prefill
    assert record.ttft == pytest.approx(first * MS)
    assert record.chunk_times == pytest.approx([first * MS, (joined + 4.0) * MS, (joined + 8.0) * MS])


class Fixed:
    """Sends the n-th request to server `order[n]`; the n-th routing moves the requests `moves[n]` names
    (rids) to that same server; `look` seconds after the n-th response ended, those `drains[n]` names
    move to the server named with them."""

    def __init__(
        self, order: list[int], moves: dict[int, list[str]] | None = None, drains: dict[int, list[tuple[str, int]]] | None = None,
        look: float = 0.0,
    ) -> None:
        self.order = iter(order)
        self.moves = moves or {}
        self.drains = drains or {}
        self.look = look
        self.routed = self.finished = 0
        self.last = -1
        self.moved_to: list[tuple[str, int, int]] = []
        self.resent_to: list[tuple[str, int]] = []
        self.looked: list[float] = []

    def route(self, request: Request, now: float) -> int:
        self.last = next(self.order)
        self.routed += 1
        return self.last

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        pass

    def finish(self, request: Request, now: float, output_tokens: int | None, cached_tokens: int = 0) -> None:
        self.finished += 1

    def take_moves(self) -> list[tuple[str, int]]:
        return [(rid, self.last) for rid in self.moves.get(self.routed - 1, [])]

    def moved(self, request: Request, to: int, produced: int, now: float) -> None:
        self.moved_to.append((request.rid, to, produced))

    def resent(self, request: Request, to: int, now: float) -> None:
        self.resent_to.append((request.rid, to))

    def drain_look(self, now: float) -> DrainLook | None:
        return DrainLook(now + self.look, self.finished - 1) if self.look else None

    def drain(self, look: DrainLook) -> list[tuple[str, int]]:
        self.looked.append(look.at)
        assert isinstance(look.mark, int)
        return self.drains.get(look.mark, [])


def test_two_colocated_servers_take_turns_on_their_gpu(round_profile: Path) -> None:
    node = node_of(colocated(round_profile), Fixed([0, 1]))
    on_eagle = send(node, RequestSpec(WORDS, 20, output_len=9))  # 1 + 4 + 4 tokens: three steps
    on_plain = send(node, RequestSpec(WORDS, 20, output_len=3))
    node.events.run()
    prefill = 27 * 0.01
    eagle1 = 3.0 + 1.0 + prefill  # EAGLE asked first, so it steps first
    plain1 = eagle1 + 2.5 + prefill
    eagle2 = plain1 + 4.0
    plain2 = eagle2 + 2.5
    eagle3 = plain2 + 4.0
    plain3 = eagle3 + 2.5
    first = 2.0 + 0.5 + prefill  # within the EAGLE server's first step: its prefill and one target (plain) step
    assert on_eagle[0].chunk_times == pytest.approx([first * MS, eagle2 * MS, eagle3 * MS])
    assert on_plain[0].chunk_times == pytest.approx([plain1 * MS, plain2 * MS, plain3 * MS])
    assert [len(t.split()) for t in on_eagle[0].chunk_texts] == [1, 4, 4]


def test_a_moved_request_goes_on_where_it_left_off_on_its_new_server(round_profile: Path) -> None:
    alone = node_of(replicas("eagle", 1, round_profile))
    unmoved = send(alone, RequestSpec(WORDS, 20, output_len=13))
    alone.events.run()
    router = Fixed([0, 1], moves={1: ["vnode-0"]})  # the second routing moves the first request to plain
    node = node_of(colocated(round_profile), router)
    moved = send(node, RequestSpec(WORDS, 20, output_len=13))
    send(node, RequestSpec(WORDS, 20, output_len=3), at=10 * MS)  # after the EAGLE request's first chunks
    node.events.run()
    (record,), (before,) = moved, unmoved
    (rid, to, produced), = router.moved_to
    assert (rid, to) == ("vnode-0", 1) and 0 < produced < 13
    # One record for the client: all its tokens, its own prompt, the text it would have had.
    assert record.completion_tokens == 13 and record.prompt_tokens == before.prompt_tokens
    assert record.answer == before.answer
    # From the move on, plain decode: a token a chunk (its EAGLE chunks carried up to 4).
    assert [len(t.split()) for t in record.chunk_texts][-(13 - produced):] == [1] * (13 - produced)


def test_a_request_moved_before_its_first_token_is_sent_whole_to_its_new_server(round_profile: Path) -> None:
    alone = node_of(replicas("plain", 1, round_profile))
    unmoved = send(alone, RequestSpec(WORDS, 20, output_len=13))
    alone.events.run()
    router = Fixed([0, 1], moves={1: ["vnode-0"]})  # the second routing, at the same instant, moves the first
    node = node_of(colocated(round_profile), router)
    moved = send(node, RequestSpec(WORDS, 20, output_len=13))
    send(node, RequestSpec(WORDS, 20, output_len=3))
    node.events.run()
    (record,), (before,) = moved, unmoved
    assert router.resent_to == [("vnode-0", 1)] and router.moved_to == []
    assert node.servers[0].core.num_aborted == 1  # dropped where it waited
    # Plain's answer from its first token: its prompt prefilled there, a token a chunk, the text unmoved.
    assert record.completion_tokens == 13 and record.prompt_tokens == before.prompt_tokens
    assert record.answer == before.answer and [len(t.split()) for t in record.chunk_texts] == [1] * 13


def test_a_look_after_a_response_ended_moves_a_request_and_never_keeps_time_going(round_profile: Path) -> None:
    # Both requests on plain; 1 ms after the short one ends the router moves the long one to EAGLE.
    router = Fixed([1, 1], drains={0: [("vnode-0", 0)]}, look=1 * MS)
    node = node_of(colocated(round_profile), router)
    long, short = send(node, RequestSpec(WORDS, 20, output_len=13)), send(node, RequestSpec(WORDS, 20, output_len=2))
    node.events.run()
    (rid, to, produced), = router.moved_to
    assert (rid, to) == ("vnode-0", 0) and 2 <= produced < 13
    assert long[0].completion_tokens == 13 and short[0].completion_tokens == 2
    assert max(len(t.split()) for t in long[0].chunk_texts[produced:]) > 1  # from the move on, EAGLE's chunks
    # The look after the long one's own end, past the last chunk, never ran: time stopped at that chunk.
    assert router.looked == [pytest.approx(short[0].end + 1 * MS)] and node.events.now == long[0].end


def test_a_shared_prefix_shortens_the_second_prefill_by_exactly_the_cached_tokens(round_profile: Path) -> None:
    system = " ".join(["the"] * 100)
    first = RequestSpec("one two three", 3, output_len=4, system=system)
    second = RequestSpec("four five six", 3, output_len=4, system=system)
    warm = node_of(replicas("plain", 1, round_profile))
    send(warm, first)
    warm.events.run()
    reused = send(warm, second, at=warm.events.now + 1.0)
    warm.events.run()
    cold = node_of(replicas("plain", 1, round_profile))
    fresh = send(cold, second)
    cold.events.run()
    # The system message (3 header tokens, 100 words, end of turn) and the user header are cached.
    assert reused[0].cached_tokens == 107 and fresh[0].cached_tokens == 0
    assert fresh[0].ttft - reused[0].ttft == pytest.approx(107 * 0.01 * MS)


def test_the_balancer_sends_each_request_to_the_least_busy_server(round_profile: Path) -> None:
    router = LeastInFlightRouter([f"s{i}" for i in range(4)])
    node = node_of(replicas("plain", 4, round_profile), router)
    done = [send(node, RequestSpec(WORDS, 20, output_len=6)) for _ in range(6)]
    inflight: list[int] = []
    node.events.at(1e-6, ARRIVAL, lambda: inflight.extend(router.balancer.inflight))  # before any step ends
    node.events.run()
    assert inflight == [2, 2, 1, 1]  # ties rotate from the first server
    assert router.balancer.inflight == [0, 0, 0, 0]
    # Servers 2 and 3 run one request each: 2.5 ms a step. Servers 0 and 1 start their first request
    # alone (2.77 ms with its prefill); the second joins the next step (3 ms + its 0.27 ms prefill),
    # then both decode at batch 2 (3 ms) until the first ends and the second finishes alone (2.5 ms).
    first = (3.27 + 4 * 3.0) / 5
    second = (4 * 3.0 + 2.5) / 5
    assert sorted(round(request_tpot(d[0]) / MS, 6) for d in done) == [2.5, 2.5, second, second, first, first]


def test_a_hop_delays_the_request_on_its_way_in_and_every_chunk_on_its_way_out(round_profile: Path) -> None:
    hop = 1.5 * MS
    ideal, far = node_of(replicas("plain", 1, round_profile)), TargetSpec("far", replicas("plain", 1, round_profile))
    slow = far.node(EventQueue(), hop=hop)
    near, away = send(ideal, RequestSpec(WORDS, 20, output_len=5)), send(slow, RequestSpec(WORDS, 20, output_len=5))
    ideal.events.run()
    slow.events.run()
    assert away[0].start == near[0].start == 0.0
    assert away[0].ttft == pytest.approx(near[0].ttft + 2 * hop) and away[0].e2e == pytest.approx(near[0].e2e + 2 * hop)
    assert request_tpot(away[0]) == pytest.approx(request_tpot(near[0]))
    assert slow.events.now == pytest.approx(away[0].end)  # the client heard the end a hop after the last step
