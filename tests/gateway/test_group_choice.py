"""The (group, mode) rule of gateway/policies/adaptive/rules.py as a function of plain data."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from gateway.policies.adaptive.fit import Curve, EstimatorConfig, TpotCurve, TpotEstimator, TpotLine
from gateway.policies.adaptive.rules import BackendState, GroupState, PromptCost, choose, rate_tpot

# field-8gpu's calibrated lines (ms per token): EAGLE step 5.82 + 8.47n at tau 3, plain 4.53 + 1.294n.
# Their whole-load crossover is about 1.7 requests.
FIELD_E = TpotLine(5.82 / 3, 8.47 / 3)
FIELD_P = TpotLine(4.53, 1.294)
# llama8b-h100's: EAGLE is faster at every load up to several hundred.
LLAMA_E = TpotLine(10.71 / 2.9, 0.149 / 2.9)
LLAMA_P = TpotLine(6.27, 0.045)


def eagle(group: str = "g0", inflight: int = 0, **state: Any) -> BackendState:
    return backend(True, group, inflight, **{"line": FIELD_E, "cap": 128, "tau": 3.0, **state})


def plain(group: str = "g0", inflight: int = 0, **state: Any) -> BackendState:
    return backend(False, group, inflight, **{"line": FIELD_P, **state})


def backend(
    speculative: bool,
    group: str,
    inflight: int,
    *,
    line: Curve | None,
    remaining: float = 1.0,
    available: bool = True,
    cap: int | None = None,
    tau: float = 1.0,
    room: float | None = None,
    full: bool = False,
) -> BackendState:
    name = f"{'eagle' if speculative else 'plain'}-{group}"
    return BackendState(name, group, speculative, available, inflight, cap, line, tau, remaining, room, full)


def test_a_lone_request_speculates() -> None:
    assert choose([eagle(), plain()]) == ("eagle-g0", "adaptive_predicted_faster")


def test_a_lone_request_decodes_plain_when_the_group_has_been_carrying_more() -> None:
    # The burst's first request would mix modes for its whole life once the rest arrives.
    assert choose([eagle(), plain()], {"g0": GroupState(4.0)}) == ("plain-g0", "adaptive_predicted_faster")


def test_load_spreads_to_the_idle_group() -> None:
    backends = [eagle("g0", 1), plain("g0"), eagle("g1"), plain("g1")]
    assert choose(backends) == ("eagle-g1", "adaptive_predicted_faster")
    backends = [eagle("g0"), plain("g0", 3), eagle("g1"), plain("g1", 2)]
    assert choose(backends) == ("plain-g1", "adaptive_predicted_faster")


def test_identical_groups_balance_even_with_biased_lines() -> None:
    # EAGLE's line 15% low and plain's 15% high: one group speculating with few requests must not
    # look cheaper than a plain group with fewer.
    e_low, p_high = TpotLine(FIELD_E.alpha * 0.85, FIELD_E.beta * 0.85), TpotLine(FIELD_P.alpha * 1.15, FIELD_P.beta * 1.15)
    backends = [eagle("g0", 4, line=e_low), plain("g0", line=p_high), eagle("g1", line=e_low), plain("g1", 3, line=p_high)]
    name, _ = choose(backends)
    assert name.endswith("g1")


def test_the_group_does_not_mix_modes_while_its_requests_are_young() -> None:
    # One EAGLE request just started; plain would serve two faster, but switching now runs both
    # servers' steps for the rest of its life.
    assert choose([eagle(inflight=1, remaining=0.99), plain()], {"g0": GroupState(1.0)}) == ("eagle-g0", "adaptive_group_stay")


def test_the_group_switches_to_plain_when_its_eagle_requests_are_draining() -> None:
    backends = [eagle(inflight=1, remaining=0.02), plain()]
    assert choose(backends, {"g0": GroupState(1.0)}) == ("plain-g0", "adaptive_group_switch")


def test_the_group_switches_at_once_when_the_gain_is_large() -> None:
    # Eight young EAGLE requests: staying costs far more than mixing until they finish.
    backends = [eagle(inflight=8, remaining=0.9), plain()]
    assert choose(backends, {"g0": GroupState(8.0)}) == ("plain-g0", "adaptive_group_switch")


def test_speculation_is_left_only_for_the_load_over_the_new_requests_life() -> None:
    # A second request beside one EAGLE stream halfway through: plain is faster for two (7.1 against
    # 7.6 ms), but over the new request's life the first counts for the half it has left and the few
    # arriving meanwhile (0.2 on average) for their part: 1.7 requests, where EAGLE serves as fast.
    halfway = [eagle(inflight=1, remaining=0.5), plain()]
    assert choose(halfway, {"g0": GroupState(2.0, True, arriving=0.2)}) == ("eagle-g0", "adaptive_group_stay")
    # Before a life is known, nor the arrivals over it: the load now counts, as before.
    assert choose(halfway, {"g0": GroupState(2.0, True)}) == ("plain-g0", "adaptive_group_switch")
    # A young stream lasts the whole life: two requests, and the group switches.
    young = [eagle(inflight=1, remaining=0.95), plain()]
    assert choose(young, {"g0": GroupState(2.0, True, arriving=0.2)}) == ("plain-g0", "adaptive_group_switch")


def test_a_light_group_reads_the_load_the_node_will_send_it() -> None:
    # Lines crossing at 3 (tau 3). g1 speculates with two nearly finished streams beside g0's six young
    # plain ones: its own streams last 0.4 of the life, but the node's arrivals go to the lighter group,
    # so each group meets its share of the node's load, (1 + 5.4 + 0.4) / 2 plus the arrivals: 4.4.
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    backends = [eagle("g0", line=e), plain("g0", 6, line=p, remaining=0.9), eagle("g1", 2, line=e, remaining=0.2), plain("g1", line=p)]
    state = {"g0": GroupState(4.5, False, arriving=1.0), "g1": GroupState(4.5, True, arriving=1.0)}
    assert choose(backends, state) == ("plain-g1", "adaptive_group_switch")


def test_a_switch_is_priced_against_the_requests_it_strands() -> None:
    # Lines crossing at 3 requests (EAGLE 1 + n at tau 3, plain 2.5 + 0.5n): at 3.25 plain is 2% faster.
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    young = [eagle(inflight=2, line=e, remaining=0.95), plain(line=p)]
    assert choose(young, {"g0": GroupState(3.25)}) == ("eagle-g0", "adaptive_group_stay")
    # Nearly drained, the same gain pays for the little mixing left.
    drained = [eagle(inflight=2, line=e, remaining=0.05), plain(line=p)]
    assert choose(drained, {"g0": GroupState(3.25)}) == ("plain-g0", "adaptive_group_switch")
    # Further past the crossover the gain pays for a whole life of mixing.
    assert choose(young, {"g0": GroupState(6.0)}) == ("plain-g0", "adaptive_group_switch")


def test_speculation_is_left_at_the_price_of_moving_its_young_streams_where_the_load_has_settled() -> None:
    # A burst's first streams on EAGLE, just started, at 3.25 where plain is 3% faster (the lines above): draining
    # them costs more than the gain over 4 lives, but moving them costs only their re-prefill (0.1 a token).
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    young = [replace(eagle(inflight=2, line=e, remaining=0.95), takeover=0.1), plain(line=p)]
    settled = {"g0": GroupState(3.25, True, settled=3.25)}
    assert choose(young, settled) == ("plain-g0", "adaptive_group_switch")
    # A passing peak (the group settled at 2, where EAGLE is faster) would be switched back: its drain is the price.
    assert choose(young, {"g0": GroupState(3.25, True, settled=2.0)}) == ("eagle-g0", "adaptive_group_stay")
    # Unless the request comes in a burst, whose size the load it settled at before does not tell: its streams move.
    assert choose(young, {"g0": GroupState(3.25, True, settled=2.0, burst=True)}) == ("plain-g0", "adaptive_group_switch")
    # So is a switch whose streams would not follow it, or whose re-prefill is not known.
    assert choose(young, settled, strays_follow=False) == ("eagle-g0", "adaptive_group_stay")
    assert choose([replace(young[0], takeover=None), young[1]], settled) == ("eagle-g0", "adaptive_group_stay")
    # And only speculation is left this way: back to it, a plain group's young stream is priced at its drain
    # (EAGLE 3.0 against plain 3.5 at 2 requests: a gain of 2.0 over 4 lives, against 2.85 of both servers' steps).
    plain_young = [eagle(line=e), replace(plain(inflight=1, line=p, remaining=0.95), takeover=0.0)]
    assert choose(plain_young, {"g0": GroupState(2.0, False, settled=2.0)}) == ("plain-g0", "adaptive_group_stay")


def test_speculation_is_not_left_for_a_rise_the_settled_load_does_not_share() -> None:
    # Lines crossing at 3 requests (the lines above); two EAGLE streams halfway, which would follow a switch at
    # 0.1 a token of re-prefill. The forecast reads 6, but the group settled at 2, where EAGLE is faster: under
    # random arrivals such a rise passes, and a switch this cheap would be made again at every peak.
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    backends = [replace(eagle(inflight=2, line=e, remaining=0.5), takeover=0.1), plain(line=p)]
    assert choose(backends, {"g0": GroupState(6.0, True, settled=6.0)}) == ("plain-g0", "adaptive_group_switch")
    assert choose(backends, {"g0": GroupState(6.0, True, settled=2.0)}) == ("eagle-g0", "adaptive_group_stay")
    # A burst's size is not told by the load settled before it: its requests leave speculation at the load they meet.
    assert choose(backends, {"g0": GroupState(6.0, True, settled=2.0, burst=True)}) == ("plain-g0", "adaptive_group_switch")
    # Streams that stay to drain (or whose re-prefill is not known yet) are priced as before: their drain
    # at the forecast, which plain's gain at 6 pays for.
    assert choose(backends, {"g0": GroupState(6.0, True, settled=2.0)}, strays_follow=False) == ("plain-g0", "adaptive_group_switch")
    unknown = [replace(backends[0], takeover=None), backends[1]]
    assert choose(unknown, {"g0": GroupState(6.0, True, settled=2.0)}) == ("plain-g0", "adaptive_group_switch")


def test_a_switch_is_priced_as_the_new_mode_carrying_the_groups_load() -> None:
    # Lines crossing at 3 requests (tau 3), 8 expected per group: g0 speculates with four streams and would
    # switch, g1 already decodes six plain. The switch moves g0's streams to plain (rule 7): 5 there, 5.0 ms
    # against g1's 6.0 at 7, and g0 switches. Priced with its four EAGLE streams lasting (18 ms a token),
    # g1 took every request however many it held.
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    backends = [eagle("g0", 4, line=e), plain("g0", line=p), eagle("g1", line=e), plain("g1", 6, line=p)]
    state = {"g0": GroupState(8.0, True), "g1": GroupState(8.0, False)}
    assert choose(backends, state) == ("plain-g0", "adaptive_group_switch")
    # Where streams do not move, they decode beside the switch until they end (a third of its life
    # here: 8.0 ms a token), and g1 serves it.
    assert choose(backends, state, strays_follow=False) == ("plain-g1", "adaptive_predicted_faster")


def test_requests_beside_a_groups_mode_do_not_draw_the_next_one_beside_them() -> None:
    # Field's group runs plain (two requests) with three EAGLE requests beside it, half done, where this
    # prompt's prefix lives; plain would prefill 100 ms of it. Priced as lasting, the three EAGLE
    # requests' steps (31 ms a round) made plain cost 40 ms a token and the prompt went beside them
    # (42 ms with what it adds to plain's rounds); they last a sixth of its life: 14 ms, and plain
    # serves it. A prompt whose prefill on plain is 2 s still goes beside.
    backends = [eagle(inflight=3, remaining=0.5), plain(inflight=2)]
    state = {"g0": GroupState(5.0, False)}
    held = PromptCost({"eagle-g0": 0.0, "plain-g0": 100.0}, output_tokens=128)
    assert choose(backends, state, held) == ("plain-g0", "adaptive_predicted_faster")
    long = PromptCost({"eagle-g0": 0.0, "plain-g0": 2000.0}, output_tokens=128)
    assert choose(backends, state, long) == ("eagle-g0", "adaptive_prefix_beside")


def test_a_mixed_group_sends_to_the_mode_of_its_load() -> None:
    assert choose([eagle(inflight=1), plain(inflight=3)]) == ("plain-g0", "adaptive_predicted_faster")


def test_and_back_to_eagle_when_the_load_falls() -> None:
    # Lines crossing at 3 requests: EAGLE 1 + n, plain 2.5 + 0.5n (tau 3).
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    young = [eagle(line=e), plain(inflight=1, line=p, remaining=0.99)]
    assert choose(young, {"g0": GroupState(1.0)}) == ("plain-g0", "adaptive_group_stay")
    draining = [eagle(line=e), plain(inflight=1, line=p, remaining=0.01)]
    assert choose(draining, {"g0": GroupState(1.0)}) == ("eagle-g0", "adaptive_group_switch")
    assert choose([eagle(line=e), plain(inflight=4, line=p)], {"g0": GroupState(4.0)})[0] == "plain-g0"


def test_speculation_resumes_only_once_the_settled_load_is_light_too() -> None:
    # An idle group that last ran plain: a lull after heavy traffic is not light traffic.
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    backends = [eagle(line=e), plain(line=p)]
    assert choose(backends, {"g0": GroupState(1.0, False, settled=8.0)}) == ("plain-g0", "adaptive_group_stay")
    assert choose(backends, {"g0": GroupState(1.0, False, settled=1.5)}) == ("eagle-g0", "adaptive_group_switch")


def test_speculation_is_not_trusted_past_where_it_was_measured() -> None:
    # EAGLE measured at 1 to 4 requests, extrapolated flat enough to look faster at 16: a plain group
    # carrying 16 does not turn to it; within its reach it would.
    e = TpotCurve(((1.0, 1.0), (4.0, 1.3)), 0.1, 0.1)
    p = TpotLine(2.5, 0.1)
    backends = [eagle(line=e), plain(inflight=15, line=p, remaining=0.01)]
    assert choose(backends, {"g0": GroupState(16.0, False, settled=16.0)}) == ("plain-g0", "adaptive_group_stay")
    near = [eagle(line=e), plain(inflight=4, line=p, remaining=0.01)]
    assert choose(near, {"g0": GroupState(5.0, False, settled=5.0)}) == ("eagle-g0", "adaptive_group_switch")


def test_plain_measured_at_light_load_does_not_hold_a_busy_group_on_eagle() -> None:
    # Plain decode measured at one and two requests, a few responses slowed by prefills: the stretch's
    # slope carried to 16 prices plain above EAGLE there, and plain is never sent the load that would
    # show otherwise. With the prior's slope past twice its reach, the busy group turns to plain.
    lines = {}
    for far in (False, True):
        estimator = TpotEstimator(EstimatorConfig(prior_slope_ratio=0.01, far_prior=far))
        for n, tpot in [(1.0, 5.9)] * 12 + [(1.25, 7.0)] * 4 + [(1.9, 15.0)] * 4 + [(2.0, 8.6)] * 12:
            estimator.observe(n, tpot, tokens=127)
        lines[far] = estimator.curve
    state = {"g0": GroupState(16.0, True, settled=16.0)}
    busy = [eagle(inflight=15, remaining=0.5), plain(line=lines[False])]
    assert choose(busy, state) == ("eagle-g0", "adaptive_predicted_faster")
    busy = [eagle(inflight=15, remaining=0.5), plain(line=lines[True])]
    assert choose(busy, state) == ("plain-g0", "adaptive_group_switch")


def test_speculation_wins_at_every_load_on_llama() -> None:
    backends = [eagle(f"g{i}", 16, line=LLAMA_E, tau=2.9) for i in range(8)]
    backends += [plain(f"g{i}", line=LLAMA_P) for i in range(8)]
    backends[3] = eagle("g3", 15, line=LLAMA_E, tau=2.9)
    assert choose(backends, {f"g{i}": GroupState(16.0) for i in range(8)}) == ("eagle-g3", "adaptive_predicted_faster")


def test_the_eagle_cap_is_respected() -> None:
    assert choose([eagle(inflight=4, cap=4, line=LLAMA_E), plain(line=LLAMA_P)]) == ("plain-g0", "adaptive_cap")
    # A capped group's load still counts: the other group's EAGLE server takes the request.
    backends = [eagle("g0", 4, cap=4, line=LLAMA_E), plain("g0", line=LLAMA_P), eagle("g1", 3, line=LLAMA_E), plain("g1", line=LLAMA_P)]
    assert choose(backends) == ("eagle-g1", "adaptive_predicted_faster")
    # Not stuck in a capped mode either: a full EAGLE server is no reason to stay.
    assert choose([eagle(inflight=4, cap=4, remaining=1.0), plain()])[0] == "plain-g0"


def test_a_server_that_would_make_the_request_wait_for_kv_room_gets_nothing() -> None:
    # EAGLE is the faster mode at one request; full, its group's plain server takes the request, named for it.
    assert choose([eagle(full=True), plain()]) == ("plain-g0", "adaptive_kv_room")
    assert choose([eagle(full=True), plain(), eagle("g1"), plain("g1")]) == ("eagle-g1", "adaptive_predicted_faster")


def test_unavailable_backends_are_skipped() -> None:
    assert choose([eagle(available=False), plain()]) == ("plain-g0", "adaptive_unavailable")
    backends = [eagle("g0"), plain("g0"), eagle("g1", available=False), plain("g1", available=False)]
    assert choose(backends, {"g0": GroupState(1.0)}) == ("eagle-g0", "adaptive_predicted_faster")
    # A group whose plain server is down is its EAGLE server alone, priced at its own load.
    backends = [eagle("g0", 2), plain("g0", available=False), eagle("g1", 2), plain("g1", 2)]
    assert choose(backends)[0] == "eagle-g0"
    with pytest.raises(ValueError):
        choose([eagle(available=False), plain(available=False)])


@pytest.mark.parametrize(("n_e", "n_p"), [(0, 0), (0, 3), (1, 1), (2, 5), (3, 2), (5, 9)])
def test_groups_of_one_follow_the_partitioned_rule(n_e: int, n_p: int) -> None:
    backends = [eagle("a", n_e), plain("b", n_p)]
    expected = "eagle-a" if FIELD_E.at(n_e + 1) < FIELD_P.at(n_p + 1) else "plain-b"
    assert choose(backends, {"a": GroupState(10.0), "b": GroupState(10.0)}) == (expected, "adaptive_predicted_faster")


def test_before_the_lines_are_fitted_a_lone_request_speculates() -> None:
    assert choose([eagle(line=None), plain(line=None)]) == ("eagle-g0", "adaptive_prior")
    assert choose([eagle(inflight=1, line=None), plain(line=None)]) == ("plain-g0", "adaptive_prior")
    backends = [eagle("g0", 1, line=None), plain("g0", line=None), eagle("g1", line=None), plain("g1", line=None)]
    assert choose(backends) == ("eagle-g1", "adaptive_prior")


def test_the_group_holding_the_prompt_wins_a_tie_on_load() -> None:
    # Two idle groups at one load: g1 holds 3,000 of the prompt's tokens, which g0 would prefill.
    backends = [eagle("g0"), plain("g0"), eagle("g1"), plain("g1")]
    cost = PromptCost({"eagle-g0": 300.0, "plain-g0": 300.0, "eagle-g1": 0.0, "plain-g1": 300.0}, output_tokens=256)
    assert choose(backends) == ("eagle-g0", "adaptive_predicted_faster")
    assert choose(backends, prompt=cost) == ("eagle-g1", "adaptive_prefix")


def test_affinity_is_weighed_against_load_not_obeyed() -> None:
    # The holder carries five more requests: its slower decode of 256 tokens (12.3 against 4.8 ms a
    # token, field's lines, in ms as these lines are) costs about 1.9 s more, more than the prefill it
    # saves for a short prompt, less than it saves for a long one.
    backends = [eagle("g0"), plain("g0"), eagle("g1"), plain("g1", 5)]
    short = PromptCost({"eagle-g0": 20.0, "plain-g0": 20.0, "eagle-g1": 20.0, "plain-g1": 0.0}, output_tokens=256)
    assert choose(backends, prompt=short)[0] == "eagle-g0"
    long = PromptCost({"eagle-g0": 3000.0, "plain-g0": 3000.0, "eagle-g1": 3000.0, "plain-g1": 0.0}, output_tokens=256)
    assert choose(backends, prompt=long) == ("plain-g1", "adaptive_prefix")


def test_without_a_held_prefix_the_load_alone_decides() -> None:
    backends = [eagle("g0", 1), plain("g0"), eagle("g1"), plain("g1")]
    even = PromptCost({"eagle-g0": 0.3, "plain-g0": 0.3, "eagle-g1": 0.3, "plain-g1": 0.3}, output_tokens=256)
    assert choose(backends, prompt=even) == choose(backends)


def test_a_prompt_waits_for_the_prefill_queued_where_it_goes() -> None:
    # Two idle groups, field's lines in ms: g0's GPUs have a long prompt's prefill still to run (`queued`).
    backends = [eagle("g0"), plain("g0"), eagle("g1"), plain("g1")]
    prompt = PromptCost({b.name: 300.0 for b in backends}, output_tokens=256)
    assert choose(backends, prompt=prompt) == ("eagle-g0", "adaptive_predicted_faster")
    queued = {"g0": GroupState(queued=2000.0), "g1": GroupState()}
    assert choose(backends, queued, prompt) == ("eagle-g1", "adaptive_prefill_wait")
    # ... weighed against what it costs elsewhere: on g1, beside five requests, it decodes its 256 tokens
    # slower (on the plain server, faster at six) and its prefill stalls them, about 3.4 s in all: more
    # than a 2 s wait, less than an 8 s one.
    busy = [eagle("g0"), plain("g0"), eagle("g1", 5), plain("g1")]
    assert choose(busy, queued, prompt) == ("eagle-g0", "adaptive_predicted_faster")
    assert choose(busy, {"g0": GroupState(queued=8000.0)}, prompt) == ("plain-g1", "adaptive_prefill_wait")


def test_the_other_server_of_a_group_takes_a_long_prompt_with_a_short_answer() -> None:
    # The group runs plain; its idle EAGLE server holds the whole prompt. A 4-token answer decoded
    # beside plain's steps costs less than prefilling 30 s worth; a 2,000-token one does not.
    e, p = TpotLine(1e-3, 1e-3), TpotLine(2.5e-3, 0.5e-3)
    backends = [eagle(line=e), plain(inflight=6, line=p)]
    state = {"g0": GroupState(7.0, False)}
    held = {"eagle-g0": 0.0, "plain-g0": 30.0}
    assert choose(backends, state, PromptCost(held, output_tokens=4)) == ("eagle-g0", "adaptive_prefix_beside")
    assert choose(backends, state, PromptCost({"eagle-g0": 0.0, "plain-g0": 0.01}, output_tokens=2000))[0] == "plain-g0"


# A long-context burst on llama8b-h100 with EAGLE's larger KV share (7,680 + 512 tokens a request): plain's
# line, measured near idle only, extrapolates nearly flat and predicts it faster at 16 requests, but its KV
# cache holds 6 of them and EAGLE's 20.
BURST_E = TpotLine(5.5, 0.14)
BURST_P = TpotLine(6.3, 0.0063)


def test_a_group_does_not_switch_to_a_mode_whose_kv_cache_cannot_hold_its_load() -> None:
    def group(plain_room: float | None, eagle_room: float | None) -> list[BackendState]:
        return [eagle("g0", 8, line=BURST_E, remaining=0.0, room=eagle_room), plain("g0", line=BURST_P, room=plain_room)]

    burst = {"g0": GroupState(16.0, mode=True)}
    assert choose(group(None, None), burst) == ("plain-g0", "adaptive_group_switch")
    assert choose(group(6.0, 20.0), burst) == ("eagle-g0", "adaptive_predicted_faster")
    # Room for the whole load in both: the lines alone decide, as without a known capacity.
    assert choose(group(40.0, 40.0), burst) == ("plain-g0", "adaptive_group_switch")


def test_a_request_goes_where_it_would_not_wait_for_kv_room() -> None:
    # Two plain groups of one with the same line: the one whose KV cache is full makes it wait a round.
    full = backend(False, "g0", 6, line=FIELD_P, room=4.0)
    roomy = backend(False, "g1", 7, line=FIELD_P, room=64.0)
    assert choose([full, roomy]) == ("plain-g1", "adaptive_predicted_faster")
    assert choose([replace(full, room=None), roomy]) == ("plain-g0", "adaptive_predicted_faster")


def test_a_conversation_moves_to_the_faster_decode_when_its_next_turns_repay_the_prefill() -> None:
    # An idle field group; the conversation so far is cached on the plain server, and EAGLE would
    # prefill 150 ms of it. EAGLE decodes 128 tokens about 134 ms faster: this turn alone does not
    # repay the prefill, this turn and the next three (that build on it where it goes) do.
    held = {"eagle-g0": 150.0, "plain-g0": 0.0}
    assert choose([eagle(), plain()], prompt=PromptCost(held, output_tokens=128)) == ("plain-g0", "adaptive_prefix_beside")
    assert choose([eagle(), plain()], prompt=PromptCost(held, output_tokens=128, reuse=3.0)) == ("eagle-g0", "adaptive_predicted_faster")


def test_a_groups_load_now_counts_for_the_later_turns_only_as_far_as_it_lasts_until_them() -> None:
    # llama8b-h100, two groups on EAGLE: g0 holds the conversation so far and decodes one request, g1 is
    # idle and would prefill 15 ms of it. For this turn alone g0's extra request costs 128 tokens about
    # 7 ms: it stays. Its next three turns build on it where it goes; if g0's load lasted until they
    # come (a shared prompt whose users keep coming, persistence 1), each would decode slower there too
    # and the move repays the prefill. A conversation's next turn comes a life or more later, when that
    # request has ended (persistence 0): priced at what EAGLE costs on either group, it stays.
    backends = [eagle("g0", 1, line=LLAMA_E), plain("g0", line=LLAMA_P), eagle("g1", line=LLAMA_E), plain("g1", line=LLAMA_P)]
    held = {"eagle-g0": 0.0, "plain-g0": 15.0, "eagle-g1": 15.0, "plain-g1": 15.0}
    assert choose(backends, prompt=PromptCost(held, output_tokens=128)) == ("eagle-g0", "adaptive_prefix")
    assert choose(backends, prompt=PromptCost(held, output_tokens=128, reuse=3.0)) == ("eagle-g1", "adaptive_predicted_faster")
    assert choose(backends, prompt=PromptCost(held, output_tokens=128, reuse=3.0, persistence=0.0)) == ("eagle-g0", "adaptive_prefix")
    # What the later turns gain from the kind of placement holds whenever they come: an idle field group
    # whose plain server holds the conversation (above) still moves it to EAGLE for them.
    idle = {"eagle-g0": 150.0, "plain-g0": 0.0}
    assert choose([eagle(), plain()], prompt=PromptCost(idle, output_tokens=128, reuse=3.0, persistence=0.0)) == ("eagle-g0", "adaptive_predicted_faster")


def test_a_prefill_is_charged_for_the_requests_it_stalls() -> None:
    # g0, plain with five, holds most of a prompt with a 2-token answer: 10 ms of prefill there, 30 on the
    # idle g1. Alone it would cost less on g0 (10 + 2 x 12.3 against 30 + 2 x 4.8), but it stalls
    # g0's five requests for as long: g1 serves it.
    backends = [eagle("g0"), plain("g0", 5), eagle("g1"), plain("g1")]
    cost = PromptCost({"eagle-g0": 30.0, "plain-g0": 10.0, "eagle-g1": 30.0, "plain-g1": 30.0}, output_tokens=2)
    assert choose(backends, prompt=cost)[0] == "eagle-g1"
    # Where g0 is idle the same hold wins.
    idle = [eagle("g0"), plain("g0"), eagle("g1"), plain("g1", 5)]
    assert choose(idle, prompt=cost) == ("plain-g0", "adaptive_prefix_beside")


def test_the_prefill_its_requests_bring_weighs_on_where_a_request_goes_never_on_a_groups_mode() -> None:
    # llama8b-h100's lines (ms): g0 holds the prompt and carries three requests, g1 is idle and would
    # prefill 30 ms of it. Decode alone, g0's slower decode of 128 tokens costs less than that prefill. But
    # each request in flight stands for arrivals whose prefill runs between the decode steps (5% of the
    # group's time each here), and g0's four would make its decode a quarter slower.
    backends = [eagle("g0", 3, line=LLAMA_E, tau=2.9), plain("g0", line=LLAMA_P), eagle("g1", line=LLAMA_E, tau=2.9), plain("g1", line=LLAMA_P)]
    cost = PromptCost({"eagle-g0": 0.0, "plain-g0": 30.0, "eagle-g1": 30.0, "plain-g1": 30.0}, output_tokens=128)
    decode_alone = {"g0": GroupState(mode=True), "g1": GroupState(mode=True)}
    assert choose(backends, decode_alone, cost) == ("eagle-g0", "adaptive_prefix")
    prefilling = {name: replace(state, prefilling=0.05) for name, state in decode_alone.items()}
    assert choose(backends, prefilling, cost) == ("eagle-g1", "adaptive_predicted_faster")
    # Both modes of a group take turns on the same GPUs, so the prefill slows either alike: one group's
    # mode is the one its load alone picks, at every load.
    for n in range(12):
        for mode in (True, False):
            one = [eagle(inflight=n if mode else 0), plain(inflight=0 if mode else n)]
            assert choose(one, {"g0": GroupState(mode=mode, prefilling=0.2)}) == choose(one, {"g0": GroupState(mode=mode)})


# Under light traffic the group's mode follows its arrival rate (`GroupState.offered`, output tokens per
# ms here as the lines are in ms): with field-8gpu's lines EAGLE carries a rate below about 0.1 with
# shorter lives, plain a rate above it.


def test_a_flat_line_carries_any_rate_at_its_own_tpot_and_a_rate_past_a_line_s_capacity_never_settles() -> None:
    flat = plain(line=TpotLine(5.0, 0.0))
    for offered in (0.01, 0.5, 20.0):
        assert rate_tpot(flat, offered) == pytest.approx(5.0)
    # field-8gpu's plain line carries at most 1 / 1.294 tokens per ms, however many requests it holds.
    assert rate_tpot(plain(), 1.5 / 1.294) == math.inf
    assert rate_tpot(plain(), 0.5 / 1.294) < math.inf


def test_the_modes_rate_tpots_cross_where_they_carry_a_rate_alike() -> None:
    assert rate_tpot(eagle(), 0.0) == pytest.approx(FIELD_E.at(1))  # alone: its lone TPOT
    for offered in (0.02, 0.05, 0.08):
        assert rate_tpot(eagle(), offered) < rate_tpot(plain(), offered)
    for offered in (0.12, 0.2, 0.3):
        assert rate_tpot(eagle(), offered) > rate_tpot(plain(), offered)
    # A random arrival meets the mean load a life holds, not the instant's: at 0.05 EAGLE holds 0.28 on
    # average where a second request in flight (the instant's count) would have plain faster.
    assert FIELD_E.at(2) > FIELD_P.at(2)


def test_under_light_traffic_a_group_runs_the_mode_its_rate_wants_whatever_the_instant_holds() -> None:
    busy = [eagle(inflight=1, remaining=0.5), plain()]
    assert choose(busy, {"g0": GroupState(2.0, True)}) == ("plain-g0", "adaptive_group_switch")  # by the count
    assert choose(busy, {"g0": GroupState(2.0, True, offered=0.05)}) == ("eagle-g0", "adaptive_predicted_faster")
    # An idle group whose arrivals come faster than EAGLE carries them decodes plain, lone as this one is.
    assert choose([eagle(), plain()], {"g0": GroupState(1.0, True)}) == ("eagle-g0", "adaptive_predicted_faster")
    assert choose([eagle(), plain()], {"g0": GroupState(1.0, True, offered=0.2)}) == ("plain-g0", "adaptive_group_switch")
    assert choose([eagle(), plain()], {"g0": GroupState(1.0, False, offered=0.2)}) == ("plain-g0", "adaptive_predicted_faster")


def test_under_light_traffic_a_group_keeps_its_mode_within_the_margin_and_past_the_other_line_s_reach() -> None:
    # At 0.1 the modes' lives are within 1% of each other: either mode is kept.
    for mode, kept in ((True, "eagle-g0"), (False, "plain-g0")):
        assert choose([eagle(), plain()], {"g0": GroupState(1.0, mode, offered=0.1)})[0] == kept
    # Plain measured at one request alone: its line is its prior past there, flatter than plain decodes.
    lone = TpotCurve(((1.0, FIELD_P.at(1)),), 0.01 * FIELD_P.at(1), 0.01 * FIELD_P.at(1))
    assert rate_tpot(plain(line=lone), 0.08) < rate_tpot(eagle(), 0.08)
    # Its arrivals would meet more than that one: a speculating group stays.
    assert choose([eagle(), plain(line=lone)], {"g0": GroupState(1.0, True, offered=0.08)})[0] == "eagle-g0"
    # Measured where they would meet it, it draws the group.
    measured = TpotCurve(((1.0, FIELD_P.at(1)), (4.0, 1.01 * FIELD_P.at(1))), 0.0, 0.0)
    assert choose([eagle(), plain(line=measured)], {"g0": GroupState(1.0, True, offered=0.08)}) == ("plain-g0", "adaptive_group_switch")
