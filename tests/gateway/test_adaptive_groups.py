"""The adaptive policy across K GPU groups, as a function of plain snapshots and Completions.

Each group is a co-located EAGLE + plain pair (`g0-eagle`, `g0-plain`, ...). Lines are field-8gpu's
and llama8b-h100's (test_adaptive.py), trained with exact points, so every prediction can be worked
out by hand. The group rule itself is gateway/policies/adaptive/rules.py (test_group_choice.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.policies import Completion, Decision, Prompt, route
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.adaptive.fit import TpotLine
from gateway.policies.adaptive.forecast import RISE_AHEAD, RISE_WINDOW
from gateway.policies.adaptive.rules import BackendState
from gateway.policies.adaptive.rules import choose as group_choose
from gateway.pool.backends import Backend, Pool
from gateway.pool.snapshot import BackendView, PoolSnapshot
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN, LLAMA_EAGLE, LLAMA_PLAIN, MS, snap


def view(group: str, mode: str, n: int = 0, *, up: bool = True, expected: float = 0.0, chunks: int = 0) -> BackendView:
    return BackendView(f"{group}-{mode}", mode == "eagle", up, n, group, expected, chunks)


def groups(*loads: tuple[int, int], **extra: BackendView) -> PoolSnapshot:
    """One group per (eagle, plain) in-flight pair: g0, g1, ...; `extra` replaces a backend by name."""
    views = []
    for i, (e, p) in enumerate(loads):
        for mode, n in (("eagle", e), ("plain", p)):
            v = view(f"g{i}", mode, n)
            views.append(extra.get(v.name.replace("-", "_"), v))
    return PoolSnapshot(tuple(views))


def completion(backend: str, line: TpotLine, n: float, *, tokens: int = 129, chunks: int = 0, group_load: float | None = None) -> Completion:
    decode = line.at(n) * (tokens - 1)
    load = n if group_load is None else group_load
    return Completion(backend, tokens, 0.02, decode, mean_inflight=n, mean_group_inflight=load, token_chunks=chunks)


def trained(k: int, eagle: TpotLine, plain: TpotLine, *, points: int = 400, **kwargs: object) -> AdaptivePolicy:
    """K groups, each backend fitted exactly to its profile line (loads 1..16), every group last sent to EAGLE."""
    policy = AdaptivePolicy(**kwargs)  # type: ignore[arg-type]
    idle = groups(*[(0, 0)] * k)
    policy.routed(idle, Decision("g0-eagle", "adaptive_prior"))  # learns each backend's group and kind
    for i in range(points):
        n = 1 + i % 16
        for g in range(k):
            policy.observe(completion(f"g{g}-eagle", eagle, n))
            policy.observe(completion(f"g{g}-plain", plain, n))
    for g in range(k):  # every backend just had traffic (no probe is due), EAGLE last
        policy.routed(idle, Decision(f"g{g}-plain", "adaptive_predicted_faster"))
        policy.routed(idle, Decision(f"g{g}-eagle", "adaptive_predicted_faster"))
    return policy


def test_identical_groups_fill_least_loaded_first() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    # llama8b-h100: EAGLE is faster well past these loads, so each request speculates, on the idler group.
    assert policy.choose(groups((3, 0), (0, 0))) == Decision("g1-eagle", "adaptive_predicted_faster")
    assert policy.choose(groups((3, 0), (4, 0))) == Decision("g0-eagle", "adaptive_predicted_faster")
    policy = trained(4, LLAMA_EAGLE, LLAMA_PLAIN)
    placed = groups((0, 0), (0, 0), (0, 0), (0, 0))
    counts = [0, 0, 0, 0]
    for _ in range(12):  # a burst of 12 over 4 idle groups: three each
        decision = policy.choose(placed)
        g = int(decision.backend[1])
        counts[g] += 1
        placed = groups(*[(c, 0) for c in counts])
    assert counts == [3, 3, 3, 3]


def test_noisy_fits_of_identical_groups_do_not_pull_the_load_to_one_group() -> None:
    """Each backend's own fit is off by noise; the kind's pooled line keeps the groups balanced."""
    policy = AdaptivePolicy()
    idle = groups((0, 0), (0, 0), (0, 0))
    policy.routed(idle, Decision("g0-eagle", "adaptive_prior"))
    for i in range(400):
        n = 1 + i % 16
        for g, skew in enumerate((0.85, 1.0, 1.15)):  # g0's EAGLE looks 15% faster, g2's 15% slower
            policy.observe(completion(f"g{g}-eagle", TpotLine(LLAMA_EAGLE.alpha * skew, LLAMA_EAGLE.beta * skew), n))
            policy.observe(completion(f"g{g}-plain", LLAMA_PLAIN, n))
    for g in range(3):
        policy.routed(idle, Decision(f"g{g}-eagle", "adaptive_predicted_faster"))
        policy.routed(idle, Decision(f"g{g}-plain", "adaptive_predicted_faster"))
    counts = [0, 0, 0]
    for _ in range(24):
        g = int(policy.choose(groups(*[(c, 0) for c in counts])).backend[1])
        counts[g] += 1
    assert counts == [8, 8, 8]


def test_one_group_is_the_group_rule_on_its_own() -> None:
    """With one group the policy asks the group rule exactly what the co-located rule asks."""
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN, points=4000)  # the speculation prior has faded
    for e, p in ((0, 0), (1, 0), (0, 1), (3, 0), (0, 5), (2, 2)):
        states = [
            BackendState("g0-eagle", "g0", True, True, e, cap=128, line=TpotLine(FIELD_EAGLE.alpha, FIELD_EAGLE.beta)),
            BackendState("g0-plain", "g0", False, True, p, line=TpotLine(FIELD_PLAIN.alpha, FIELD_PLAIN.beta)),
        ]
        assert policy.choose(groups((e, p))).backend == group_choose(states)[0], (e, p)
    # field-8gpu's crossover is ~1.7: a group carrying more than one runs plain, whole.
    assert policy.choose(groups((0, 1))).backend == "g0-plain"
    assert policy.choose(groups((0, 0))).backend == "g0-eagle"


def test_tau_expected_load_and_remaining_are_learned() -> None:
    policy = AdaptivePolicy()
    snapshot = groups((0, 0), (0, 0))
    policy.routed(snapshot, Decision("g0-eagle", "adaptive_prior"))
    policy.observe(completion("g0-eagle", FIELD_EAGLE, 1, tokens=129, chunks=43, group_load=2.0))
    policy.observe(completion("g0-plain", FIELD_PLAIN, 1, tokens=64, chunks=64, group_load=4.0))
    policy.attach(lambda: groups((2, 0), (0, 0), g0_eagle=view("g0", "eagle", 2, expected=300.0, chunks=30)))
    beliefs = policy.beliefs()
    assert beliefs["backends"]["g0-eagle"]["tau"] == pytest.approx(3.0)
    assert beliefs["backends"]["g0-plain"]["tau"] == pytest.approx(1.0)
    g0 = beliefs["groups"]["g0"]
    # The node's forecast shared over its two groups: two in flight and one more, and the rise since
    # the one routing seen (one in flight after it) carried half a life ahead.
    expected = (3 + (2 - 1) * RISE_AHEAD / RISE_WINDOW) / 2
    assert g0["expected_load"] == beliefs["groups"]["g1"]["expected_load"] == pytest.approx(expected)
    assert g0["remaining"]["g0-eagle"] == pytest.approx(1.0 - 30 * 3.0 / 300.0)  # chunks x tau of expected
    assert g0["mode"] == "eagle" and beliefs["groups"]["g1"]["mode"] == "idle"
    assert g0["inflight"] == 2 and g0["backends"] == ["g0-eagle", "g0-plain"]
    assert g0["last_decision"] == "g0-eagle: adaptive_prior" and beliefs["groups"]["g1"]["last_decision"] is None


def test_a_probe_waits_until_its_group_is_idle() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN, probe_every=3)
    for _ in range(3):  # only g0-eagle gets traffic: g1's backends fall due for a probe
        policy.routed(groups((0, 0), (0, 0)), Decision("g0-eagle", "adaptive_predicted_faster"))
    busy = groups((1, 0), (1, 0))
    assert policy.choose(busy).reason != "adaptive_explore"
    # g0-plain is due too, but its group is busy: g1's plain server is measured on its idle GPUs.
    assert policy.choose(groups((1, 0), (0, 0))) == Decision("g1-plain", "adaptive_explore")


# h200-llama8b's measured steps (backends/sim/measured/h200-llama8b.toml, B=1 and B=256) as lines,
# EAGLE at tau 3: EAGLE is faster at every load a group can reach.
H200_EAGLE = TpotLine(6.53 / 3 * MS, (39.45 - 6.53) / 255 / 3 * MS)
H200_PLAIN = TpotLine(5.24 * MS, (17.06 - 5.24) / 255 * MS)


def test_no_probe_for_a_kind_the_fits_put_far_behind_at_every_load() -> None:
    # Each plain probe would decode about 2.4x slower than on EAGLE, and plain can win nowhere.
    policy = trained(2, H200_EAGLE, H200_PLAIN, probe_every=3)
    for _ in range(6):
        policy.routed(groups((0, 0), (0, 0)), Decision("g0-eagle", "adaptive_predicted_faster"))
    assert policy.choose(groups((1, 0), (0, 0))).reason != "adaptive_explore"
    # The same lines on partitioned servers: an idle plain server beats a full EAGLE one, so it is probed.
    solo = AdaptivePolicy(probe_every=3)
    solo.routed(snap(0, 0), Decision("eagle", "adaptive_prior"))
    for i in range(400):
        solo.observe(completion("eagle", H200_EAGLE, 1 + i % 16))
        solo.observe(completion("plain", H200_PLAIN, 1 + i % 16))
    for _ in range(3):
        solo.routed(snap(0, 0), Decision("eagle", "adaptive_predicted_faster"))
    assert solo.choose(snap(1, 0)) == Decision("plain", "adaptive_explore")


def test_an_unmeasured_group_borrows_its_kind_s_line() -> None:
    """g1 joined while g0 was busy: its servers use g0's lines until measured, so a busy pool does
    not fall back to the cold-start rule (plain for everything) for want of an idle moment on g1."""
    policy = trained(1, LLAMA_EAGLE, LLAMA_PLAIN, points=4000)
    busy = groups((3, 0), (1, 0))  # no group idle: nothing can be probed
    decision = policy.choose(busy)
    assert decision.backend == "g1-eagle" and decision.reason.startswith("adaptive_"), decision
    assert decision.reason not in ("adaptive_prior", "adaptive_explore")


def test_cold_start_over_groups_measures_each_backend_on_an_idle_group() -> None:
    policy = AdaptivePolicy()
    assert policy.choose(groups((0, 0), (0, 0))) == Decision("g0-eagle", "adaptive_prior")  # a lone request speculates
    # g0 is busy: the unfitted plain server of the idle group g1 is measured there.
    assert policy.choose(groups((1, 0), (0, 0))) == Decision("g1-plain", "adaptive_explore")
    # Every group busy: plain decode on the least-loaded group.
    assert policy.choose(groups((2, 0), (1, 0))) == Decision("g1-plain", "adaptive_prior")


def test_cold_start_measures_plain_one_request_at_a_time_and_a_request_alone_on_its_group_speculates() -> None:
    """Eight groups before any response: while one plain server's first request is out, the next request
    arriving on an idle group speculates there; measuring a second plain server would add nothing to the
    kind's shared line and would decode that request at plain speed."""
    policy = AdaptivePolicy()
    measuring = groups((1, 0), (0, 1), *[(0, 0)] * 6)
    assert policy.choose(measuring) == Decision("g2-eagle", "adaptive_explore")
    policy.routed(groups(*[(0, 0)] * 8), Decision("g0-eagle", "adaptive_prior"))
    policy.observe(completion("g0-eagle", LLAMA_EAGLE, 1, chunks=44))
    # EAGLE measured, plain's first response not back yet: still not a second plain server.
    assert policy.choose(groups((0, 0), (0, 1), *[(0, 0)] * 6)).backend.endswith("-eagle")
    # No group idle: plain decode on the least-loaded group, as before.
    assert policy.choose(groups(*[(1, 1)] * 7, (2, 0))) == Decision("g7-plain", "adaptive_prior")


def test_lone_requests_over_many_idle_groups_measure_each_kind_once_then_speculate() -> None:
    """Backends of a kind share one line, so one measurement per kind ends the cold start: lone
    requests on 8 idle groups are not sent to each group's plain server in turn."""
    policy = AdaptivePolicy()
    idle = groups(*[(0, 0)] * 8)
    decisions = []
    for _ in range(10):
        decision = policy.choose(idle)
        policy.routed(idle, decision)
        decisions.append(decision)
        line = LLAMA_EAGLE if decision.backend.endswith("eagle") else LLAMA_PLAIN
        policy.observe(completion(decision.backend, line, 1, chunks=44 if line is LLAMA_EAGLE else 128))
    assert [d.reason for d in decisions[:2]] == ["adaptive_prior", "adaptive_explore"]
    assert decisions[1].backend.endswith("plain")
    assert all(d.backend.endswith("eagle") and d.reason == "adaptive_predicted_faster" for d in decisions[2:])


def test_route_header_names_a_backend_or_a_mode() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    snapshot = groups((0, 3), (0, 1))
    assert route(policy, snapshot, "plain") == Decision("g1-plain", "forced")
    # Both EAGLE servers idle: the one whose group carries less.
    assert route(policy, snapshot, "eagle") == Decision("g1-eagle", "forced")
    assert route(policy, snapshot, "g0-plain") == Decision("g0-plain", "forced")
    down = groups((0, 3), (0, 1), g0_plain=view("g0", "plain", 3, up=False), g1_plain=view("g1", "plain", up=False))
    assert route(policy, down, "plain") is None
    # One pair named eagle/plain: the names keep their meaning.
    pair = PoolSnapshot((BackendView("eagle", True, True, 5), BackendView("plain", False, True, 0)))
    assert route(policy, pair, "eagle") == Decision("eagle", "forced")


def test_the_pool_keeps_expected_tokens_and_relayed_chunks_in_o1() -> None:
    pool = Pool([Backend("g0-eagle", "http://e", True, group="g0"), Backend("g0-plain", "http://p", False, group="g0")])
    a = pool.acquire("g0-eagle", max_tokens=100)
    b = pool.acquire("g0-eagle")  # no max_tokens and no history yet: nothing expected
    for t in range(5):
        a.mark_token(float(t))
    b.mark_token(0.0)
    eagle = pool.snapshot().get("g0-eagle")
    assert (eagle.expected_tokens, eagle.relayed_chunks) == (100.0, 6)
    pool.record_output("g0-plain", 40)
    c = pool.acquire("g0-eagle")
    c.move_to("g0-plain")  # failover before any byte: its expectation moves with it, at the new backend's mean
    assert pool.snapshot().get("g0-plain").expected_tokens == 40.0
    for slot in (a, b, c, a):  # release is idempotent
        slot.release()
    after = pool.snapshot()
    assert all(v.expected_tokens == 0.0 and v.relayed_chunks == 0 and v.inflight == 0 for v in after.backends)


def test_the_pool_counts_the_prompt_tokens_its_in_flight_requests_hold_where_they_are() -> None:
    pool = Pool([Backend("g0-eagle", "http://e", True, group="g0"), Backend("g0-plain", "http://p", False, group="g0")])

    def held() -> dict[str, float]:
        return {v.name: v.held_prompt_tokens for v in pool.snapshot().backends}

    a = pool.acquire("g0-eagle", max_tokens=100, prompt_tokens=30_000.0)
    b = pool.acquire("g0-eagle", prompt_tokens=500.0, weight=2)  # a batch of two sequences
    assert held() == {"g0-eagle": 31_000.0, "g0-plain": 0.0}
    b.move_to("g0-plain")  # failover before any byte
    a.mark_token(0.0)
    a.continue_on("g0-plain", 90)  # a stream moved mid-answer
    assert held() == {"g0-eagle": 0.0, "g0-plain": 31_000.0}
    a.release()
    b.release()
    assert held() == {"g0-eagle": 0.0, "g0-plain": 0.0}


def test_a_prompt_goes_where_its_prefix_lives_once_prefill_cost_is_known() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    prompt = Prompt(3000.0, {"g1-eagle": 3000.0}, max_tokens=64)
    # g0 carries one request fewer; nothing yet says what a prefill costs: the load decides.
    assert policy.choose(groups((2, 0), (3, 0)), prompt=prompt) == Decision("g0-eagle", "adaptive_predicted_faster")
    # Responses that prefilled 2,000 uncached tokens took 0.2 s to their first token: 0.1 ms a token, so
    # g1's hold saves 0.3 s, far more than one more request costs 64 tokens of its decode.
    for _ in range(5):
        policy.observe(Completion("g0-eagle", 65, 0.2, 64 * LLAMA_EAGLE.at(2), 2.0, 2.0, 22, prompt_tokens=2000))
    assert policy.choose(groups((2, 0), (3, 0)), prompt=prompt) == Decision("g1-eagle", "adaptive_prefix")
    # A prompt no backend holds leaves the load to decide.
    assert policy.choose(groups((2, 0), (3, 0)), prompt=Prompt(3000.0, {}, 64)).backend == "g0-eagle"


def engines_reporting(snapshot: PoolSnapshot, tokens: int, busy_us: int) -> PoolSnapshot:
    """`snapshot` with every engine reporting `tokens` uncached prompt tokens prefilled in `busy_us` so far."""
    return PoolSnapshot(tuple(replace(v, prefill_tokens=tokens, prefill_busy_us=busy_us) for v in snapshot.backends), snapshot.at)


def test_a_prompt_does_not_queue_behind_the_long_prefill_just_sent_to_a_group() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    for _ in range(5):  # first tokens price a prompt token at 0.1 ms ...
        policy.observe(Completion("g0-eagle", 65, 0.2, 64 * LLAMA_EAGLE.at(2), 2.0, 2.0, 22, prompt_tokens=2000))
    idle = groups((0, 0), (0, 0))
    for tokens in (1_000, 11_000):  # ... the engines' own prefill at 20 us (10,000 tokens in 0.2 s)
        policy.routed(engines_reporting(idle, tokens, 20 * tokens), Decision("g0-eagle", "adaptive_predicted_faster"))
    # A long prompt opening with a shared 512-token block both EAGLE servers hold (none holds more).
    long = Prompt(80_000.0, {"g0-eagle": 512.0, "g1-eagle": 512.0}, max_tokens=64)
    node = replace(groups((1, 0), (2, 0)), at=10.0)
    assert policy.choose(node, prompt=long) == Decision("g0-eagle", "adaptive_predicted_faster")
    policy.routed(node, Decision("g0-eagle", "adaptive_predicted_faster"), long)  # 1.59 s of prefill on g0's GPUs
    # An 8,000-token prompt with the same block in the same instant: g0 still carries one request fewer
    # (its prefill, 0.75 s at the first tokens' price, would stall one request fewer there), but there it
    # would wait 1.59 s first.
    node = replace(groups((2, 0), (3, 0)), at=10.0)
    policy.attach(lambda: node)
    queued = {group: entry["prefill_queued_seconds"] for group, entry in policy.beliefs()["groups"].items()}
    assert queued == {"g0": pytest.approx(79_488 * 20e-6), "g1": 0.0}
    prompt = Prompt(8_000.0, {"g0-eagle": 512.0, "g1-eagle": 512.0}, max_tokens=64)
    assert policy.choose(node, prompt=prompt) == Decision("g1-eagle", "adaptive_prefill_wait")
    # Once g0's prefill is done, the load decides again; and a prompt no server holds any of is left to
    # the load, as before.
    later = replace(node, at=12.0)
    assert policy.choose(later, prompt=prompt) == Decision("g0-eagle", "adaptive_predicted_faster")
    assert policy.choose(node, prompt=Prompt(8_000.0, {}, max_tokens=64)) == Decision("g0-eagle", "adaptive_predicted_faster")


def test_a_prompt_is_priced_at_one_prefill_cost_on_either_kind_so_a_held_block_does_not_choose_the_mode() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    # Times to first token over 2,000 uncached tokens: 0.3 s on EAGLE servers (their queue for KV room in
    # them), 0.04 s on plain ones.
    for _ in range(5):
        policy.observe(Completion("g0-eagle", 65, 0.3, 64 * LLAMA_EAGLE.at(2), 2.0, 2.0, 22, prompt_tokens=2000))
        policy.observe(Completion("g0-plain", 65, 0.04, 64 * LLAMA_PLAIN.at(2), 2.0, 2.0, 64, prompt_tokens=2000))
    costs = policy.beliefs()["prefill_seconds_per_token"]
    assert costs["eagle"] > 5 * costs["plain"]
    node = groups((1, 0), (1, 0))
    # A 30,000-token prompt of which g1's plain server holds one 512-token block: priced at each kind's own
    # cost, its prefill there looked 8 s cheaper than on an EAGLE server and sent it to decode beside g1's
    # EAGLE request; the block is worth 0.15 s, and the decode curves choose.
    block = Prompt(30_000.0, {"g1-plain": 512.0}, max_tokens=100)
    assert policy.choose(node, prompt=block).backend.endswith("-eagle")
    # A prefix worth more than the decode it costs is still followed to where it lives.
    history = Prompt(30_000.0, {"g1-plain": 29_000.0}, max_tokens=100)
    assert policy.choose(node, prompt=history) == Decision("g1-plain", "adaptive_prefix_beside")


def with_kv(snapshot: PoolSnapshot, **capacity: int) -> PoolSnapshot:
    """`snapshot` with the KV capacities (tokens) its engines reported, by backend name with `_` for `-`."""
    views = []
    for v in snapshot.backends:
        kv = capacity.get(v.name.replace("-", "_"), 0)
        views.append(BackendView(v.name, v.speculative, v.available, v.inflight, v.group, v.expected_tokens, v.relayed_chunks, kv, kv))
    return PoolSnapshot(tuple(views))


def test_a_prompt_goes_only_where_a_kv_cache_can_hold_it() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    # g1's servers each hold 60,000 tokens, g0's 30,000: a 40,000-token prompt fits g1 only, even busier.
    node = with_kv(groups((0, 0), (3, 0)), g0_eagle=30_000, g0_plain=30_000, g1_eagle=60_000, g1_plain=60_000)
    assert policy.choose(node, prompt=Prompt(40_000.0, {}, 512)).backend == "g1-eagle"
    assert policy.choose(node, prompt=Prompt(4_000.0, {}, 512)).backend == "g0-eagle"
    # The prompt's tokens are an estimate from its bytes: 20,000 fit g0, but it may hold up to 40,000.
    assert policy.choose(node, prompt=Prompt(20_000.0, {}, 512, most_tokens=40_000.0)).backend == "g1-eagle"
    # Where nothing holds the most it may be, the estimate decides.
    assert policy.choose(node, prompt=Prompt(20_000.0, {}, 512, most_tokens=80_000.0)).backend == "g0-eagle"
    # With its output limit it fits one server only.
    only = with_kv(groups((0, 0), (3, 0)), g0_eagle=30_000, g0_plain=30_000, g1_eagle=30_000, g1_plain=45_000)
    assert policy.choose(only, prompt=Prompt(40_000.0, {}, 4_096)) == Decision("g1-plain", "adaptive_kv_fit")
    # Where none holds it, it goes where the rules send it (the server's own error says why).
    assert policy.choose(node, prompt=Prompt(90_000.0, {}, 512)).backend == "g0-eagle"


def test_a_long_prompt_does_not_wait_for_kv_room_where_a_server_of_its_kind_elsewhere_has_it() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    node = with_kv(groups((1, 0), (3, 0)), g0_eagle=60_000, g0_plain=60_000, g1_eagle=60_000, g1_plain=60_000)

    def holding(snapshot: PoolSnapshot, **held: float) -> PoolSnapshot:
        """`snapshot` with its in-flight requests holding `held` prompt tokens, by backend name."""
        return PoolSnapshot(tuple(replace(v, held_prompt_tokens=held.get(v.name.replace("-", "_"), 0.0)) for v in snapshot.backends))

    long, short = Prompt(20_000.0, {}, 512), Prompt(2_000.0, {}, 512)
    assert policy.choose(node, prompt=long).backend == "g0-eagle"  # the less loaded group
    # g0's EAGLE server holds a 50,000-token prompt: SGLang would queue the new one behind it.
    crowded = holding(node, g0_eagle=50_000.0)
    assert policy.choose(crowded, prompt=long).backend == "g1-eagle"
    assert policy.choose(crowded, prompt=short).backend == "g0-eagle"  # it fits beside
    # With no EAGLE server elsewhere to take it, it waits rather than decode plain beside EAGLE's requests.
    assert policy.choose(holding(node, g0_eagle=50_000.0, g1_eagle=50_000.0), prompt=long).backend == "g0-eagle"


def test_short_of_kv_room_everywhere_a_long_prompt_goes_where_it_would_wait_least() -> None:
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    node = with_kv(groups((1, 0), (3, 0)), g0_eagle=60_000, g0_plain=60_000, g1_eagle=60_000, g1_plain=60_000)

    def holding(**held: tuple[float, float, int]) -> PoolSnapshot:
        """`node` with its in-flight requests holding (prompt tokens, expected output, chunks relayed), by backend name."""
        views = []
        for v in node.backends:
            prompt, expected, chunks = held.get(v.name.replace("-", "_"), (0.0, 0.0, 0))
            views.append(replace(v, held_prompt_tokens=prompt, expected_tokens=expected, relayed_chunks=chunks))
        return PoolSnapshot(tuple(views))

    long = Prompt(20_000.0, {}, 512)
    # Both EAGLE servers are short of room for it. Where half as many of their tokens must end first, it waits less ...
    assert policy.choose(holding(g0_eagle=(50_000.0, 512.0, 0), g1_eagle=(42_000.0, 1_536.0, 0)), prompt=long).backend == "g1-eagle"
    # ... and where the shares are alike, the load decides: which requests end first is not known.
    assert policy.choose(holding(g0_eagle=(50_000.0, 512.0, 0), g1_eagle=(46_000.0, 1_536.0, 0)), prompt=long).backend == "g0-eagle"
    # As short of room, a server whose requests have nearly all their output is done with them sooner.
    assert policy.choose(holding(g0_eagle=(50_000.0, 512.0, 0), g1_eagle=(50_000.0, 1_536.0, 0)), prompt=long).backend == "g0-eagle"
    assert policy.choose(holding(g0_eagle=(50_000.0, 512.0, 0), g1_eagle=(50_000.0, 1_536.0, 1_500)), prompt=long).backend == "g1-eagle"


def test_the_kv_room_is_learned_from_the_responses_footprint() -> None:
    # Plain's line is measured nearly flat, so it looks faster than EAGLE's at a burst of 16 in the group;
    # once responses show 7,680 + 512 tokens a request, plain's 56,000-token KV cache holds 6 of them.
    eagle, plain = TpotLine(5.5 * MS, 0.14 * MS), TpotLine(6.3 * MS, 0.0063 * MS)
    policy = trained(1, eagle, plain)
    burst = with_kv(PoolSnapshot((view("g0", "eagle", 15), view("g0", "plain"))), g0_eagle=165_000, g0_plain=56_000)
    assert policy.choose(burst).backend == "g0-plain"  # nothing says what a request holds yet
    for _ in range(100):  # the footprint is a moving mean over responses, as the output length is
        policy.observe(Completion("g0-eagle", 512, 0.2, 511 * eagle.at(15), 15.0, 15.0, 180, prompt_tokens=7_680))
    assert policy.choose(burst).backend == "g0-eagle"


def test_the_reuse_a_placement_is_priced_for_follows_the_share_of_prompts_found_cached() -> None:
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN)
    assert policy.beliefs()["prefix_reuse"] == 0.0  # prompts that share nothing: a placement serves one request
    for _ in range(400):  # conversations of four turns: three quarters of each prompt was sent before
        policy.observe(Completion("g0-plain", 65, 0.2, 0.3, 1.0, 1.0, prompt_tokens=4000, cached_tokens=3000))
    beliefs = policy.beliefs()
    assert beliefs["prefix_hit_share"] == pytest.approx(0.75, abs=0.01)
    assert beliefs["prefix_reuse"] == pytest.approx(3.0, abs=0.2)
    # Held prompt after prompt, a placement counts for at most four later requests.
    for _ in range(400):
        policy.observe(Completion("g0-plain", 65, 0.2, 0.3, 1.0, 1.0, prompt_tokens=4000, cached_tokens=3990))
    assert policy.beliefs()["prefix_reuse"] == 4.0


def test_a_conversation_follows_the_faster_decode_once_its_turns_are_seen_to_build_on_each_other() -> None:
    # One idle field group; the conversation so far is cached on the plain server. Prefill costs 0.1 ms
    # a token, so EAGLE would prefill 1,500 tokens in 150 ms, more than its faster decode of 128 tokens
    # saves on this turn: the plain server keeps it until prompts are seen to extend earlier ones.
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN)
    prompt = Prompt(1600.0, {"g0-plain": 1600.0, "g0-eagle": 100.0}, max_tokens=128)
    for _ in range(5):
        policy.observe(Completion("g0-plain", 65, 0.2, 64 * FIELD_PLAIN.at(1), 1.0, 1.0, prompt_tokens=2000))
    assert policy.choose(groups((0, 0)), prompt=prompt) == Decision("g0-plain", "adaptive_prefix_beside")
    for _ in range(400):
        policy.observe(Completion("g0-plain", 65, 0.1, 64 * FIELD_PLAIN.at(1), 1.0, 1.0, prompt_tokens=4000, cached_tokens=3000))
    assert policy.beliefs()["prefill_seconds_per_token"]["plain"] == pytest.approx(1e-4)
    # EAGLE decodes it; the plain server, which holds the conversation, answers its first token (a handover).
    decision = policy.choose(groups((0, 0)), prompt=prompt)
    assert (decision.backend, decision.then, decision.decodes_on) == ("g0-plain", "g0-eagle", "g0-eagle")


def test_a_conversations_next_turn_is_not_moved_for_a_load_that_will_have_passed() -> None:
    # Two llama8b-h100 groups on EAGLE; g0 decodes one request and holds 150 more of this prompt's tokens
    # than g1 (15 ms of prefill). Prompts are three quarters cached, so a placement counts for three later
    # requests, and requests live about 0.7 s.
    policy = trained(2, LLAMA_EAGLE, LLAMA_PLAIN)
    for _ in range(400):
        policy.observe(Completion("g0-eagle", 129, 0.2, 128 * LLAMA_EAGLE.at(1), 1.0, 1.0, prompt_tokens=8000, cached_tokens=6000))
    assert policy.beliefs()["prefix_reuse"] == pytest.approx(3.0, abs=0.1)

    def prompt(since_sent: float | None) -> Prompt:
        held = {"g0-eagle": 1750.0, "g0-plain": 1600.0, "g1-eagle": 1600.0, "g1-plain": 1600.0}
        return Prompt(1750.0, held, 128, since_sent=since_sent)

    node = groups((1, 0), (0, 0))
    # Its prefix was sent moments ago (a shared prompt whose users keep coming) or it is not known when:
    # g0's extra request is there for the later ones too, and moving repays the prefill.
    assert policy.choose(node, prompt=prompt(None)).backend == "g1-eagle"
    assert policy.choose(node, prompt=prompt(0.0)).backend == "g1-eagle"
    # Sent two seconds ago (a conversation's last turn and a think time): g0's request will have ended
    # when the next turn comes.
    assert policy.choose(node, prompt=prompt(2.0)) == Decision("g0-eagle", "adaptive_prefix")


def test_an_arrival_at_an_idle_node_under_light_traffic_speculates_whatever_the_last_burst_met() -> None:
    """field-8gpu's lines cross at 1.7 requests. Lone arrivals two seconds apart, then a burst of four that
    turned the group plain: the arrivals of the last lives met two on average, where a request that
    finds the node idle meets itself and, at the rate of the last arrivals, a third of one more. It
    speculates. Amid heavier traffic (most arrivals finding company) an idle moment changes nothing."""

    def light_then_burst() -> AdaptivePolicy:
        policy = trained(1, FIELD_EAGLE, FIELD_PLAIN, points=4000)
        for _ in range(60):  # a mean life of 0.77 s: one plain request alone
            policy.observe(completion("g0-plain", FIELD_PLAIN, 1))
        for t in (10.0, 12.0, 14.0, 16.0, 18.0):
            policy.routed(replace(groups((0, 0)), at=t), Decision("g0-eagle", "adaptive_predicted_faster"))
        policy.routed(replace(groups((0, 0)), at=20.0), Decision("g0-eagle", "adaptive_predicted_faster"))
        policy.routed(replace(groups((1, 0)), at=20.05), Decision("g0-plain", "adaptive_group_switch"))
        for k, t in enumerate((20.1, 20.15)):
            policy.routed(replace(groups((0, 2 + k)), at=t), Decision("g0-plain", "adaptive_predicted_faster"))
        return policy

    policy = light_then_burst()
    assert policy.choose(replace(groups((0, 0)), at=22.0)) == Decision("g0-eagle", "adaptive_group_switch")
    assert policy.choose(replace(groups((0, 1)), at=22.0)).backend == "g0-plain"  # not alone: the forecast stands

    busy = trained(1, FIELD_EAGLE, FIELD_PLAIN, points=4000)
    for _ in range(60):
        busy.observe(completion("g0-plain", FIELD_PLAIN, 1))
    for k in range(10):  # each arrival a second apart finds two plain requests in flight
        busy.routed(replace(groups((0, 2)), at=10.0 + k), Decision("g0-plain", "adaptive_predicted_faster"))
    assert busy.choose(replace(groups((0, 0)), at=21.0)).backend == "g0-plain"


def test_under_light_traffic_where_prefixes_are_reused_a_group_runs_the_mode_its_arrival_rate_wants() -> None:
    """field-8gpu's lines: EAGLE carries fewer than about 100 output tokens a second with shorter lives, plain
    more (rules.rate_tpot). Lone arrivals of 129 tokens each, every one finding the node idle: a second
    apart plain carries them better, four seconds apart EAGLE. Where prompts are three quarters cached
    (conversations), the group runs that mode whatever the instant holds: a lone arrival decodes plain at
    the faster rate, and at the slower one a second arrival beside EAGLE's request stays on EAGLE. Where
    prompts share nothing, the count rules as before."""

    def light(gap: float, *, reused: bool) -> AdaptivePolicy:
        policy = trained(1, FIELD_EAGLE, FIELD_PLAIN, points=4000)
        cached = 96 if reused else 0
        for _ in range(400):  # lives of about 0.6 s
            policy.observe(Completion("g0-plain", 129, 0.02, 128 * FIELD_PLAIN.at(1), 1.0, 1.0, prompt_tokens=128, cached_tokens=cached))
        for k in range(40):
            policy.routed(replace(groups((0, 0)), at=10.0 + gap * k), Decision("g0-eagle", "adaptive_predicted_faster"))
        return policy

    now = 10.0 + 40.0
    assert light(1.0, reused=True).choose(replace(groups((0, 0)), at=now)) == Decision("g0-plain", "adaptive_group_switch")
    assert light(1.0, reused=False).choose(replace(groups((0, 0)), at=now)).backend == "g0-eagle"
    now = 10.0 + 4.0 * 40
    assert light(4.0, reused=True).choose(replace(groups((1, 0)), at=now)).backend == "g0-eagle"
    assert light(4.0, reused=False).choose(replace(groups((1, 0)), at=now)).backend == "g0-plain"


def test_where_prompts_share_nothing_a_request_pays_the_step_it_joins_so_speculation_ends_at_its_crossover() -> None:
    """Lines that cross at 8 in flight (EAGLE 2 + 0.5n ms, plain 4 + 0.25n), tau 3, answers of 33 tokens.
    A group carrying 8 at EAGLE's crossover: by the lines alone plain gains nothing, and it stays. But a
    joining request waits out the step in progress once, and a speculative step is 3 tokens long: over
    33 tokens that prices EAGLE 9% up and plain 3%, and the group turns plain. Not where prompts reuse
    prefixes (rule 1 weighs those by the traffic's rate), nor before 32 responses have told the reuse."""
    eagle, plain = TpotLine(2.0 * MS, 0.5 * MS), TpotLine(4.0 * MS, 0.25 * MS)

    def at_crossover(cached: int, responses: int) -> Decision:
        policy = trained(1, eagle, plain)
        for i in range(responses):
            n = 1 + i % 16
            policy.observe(replace(completion("g0-eagle", eagle, n, tokens=33, chunks=11), prompt_tokens=128, cached_tokens=cached))
            policy.observe(replace(completion("g0-plain", plain, n, tokens=33, chunks=33), prompt_tokens=128, cached_tokens=cached))
        for k in range(40):  # each arrival meets 7 in flight: the forecast is 8
            policy.routed(replace(groups((7, 0)), at=10.0 + 0.01 * k), Decision("g0-eagle", "adaptive_predicted_faster"))
        return policy.choose(replace(groups((7, 0)), at=10.4))

    assert at_crossover(0, 200) == Decision("g0-plain", "adaptive_group_switch")
    assert at_crossover(96, 200) == Decision("g0-eagle", "adaptive_predicted_faster")  # three quarters cached
    assert at_crossover(0, 15) == Decision("g0-eagle", "adaptive_predicted_faster")  # 30 responses: reuse not yet known
