"""The (group, mode) rule of gateway/policies/adaptive/rules.py as a function of plain data."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.policies.adaptive.rules import BackendState, TpotLine, choose

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
    line: TpotLine | None,
    remaining: float = 1.0,
    available: bool = True,
    cap: int | None = None,
    tau: float = 1.0,
) -> BackendState:
    name = f"{'eagle' if speculative else 'plain'}-{group}"
    return BackendState(name, group, speculative, available, inflight, cap, line, tau, remaining)


def test_a_lone_request_speculates() -> None:
    assert choose([eagle(), plain()]) == ("eagle-g0", "adaptive_predicted_faster")


def test_a_lone_request_decodes_plain_when_the_group_has_been_carrying_more() -> None:
    # The burst's first request would mix modes for its whole life once the rest arrives.
    assert choose([eagle(), plain()], {"g0": 4.0}) == ("plain-g0", "adaptive_predicted_faster")


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
    assert choose([eagle(inflight=1, remaining=0.99), plain()], {"g0": 1.0}) == ("eagle-g0", "adaptive_group_stay")


def test_the_group_switches_to_plain_when_its_eagle_requests_are_draining() -> None:
    backends = [eagle(inflight=1, remaining=0.02), plain()]
    assert choose(backends, {"g0": 1.0}) == ("plain-g0", "adaptive_predicted_faster")


def test_the_group_switches_at_once_when_the_gain_is_large() -> None:
    # Eight young EAGLE requests: staying costs far more than mixing until they finish.
    backends = [eagle(inflight=8, remaining=0.9), plain()]
    assert choose(backends, {"g0": 8.0}) == ("plain-g0", "adaptive_predicted_faster")


def test_without_history_the_group_switches_at_once() -> None:
    # No recent load: nothing says the burst is over, so the group follows its load at once.
    assert choose([eagle(inflight=1, remaining=0.99), plain()]) == ("plain-g0", "adaptive_predicted_faster")


def test_a_mixed_group_sends_to_the_mode_of_its_load() -> None:
    assert choose([eagle(inflight=1), plain(inflight=3)]) == ("plain-g0", "adaptive_predicted_faster")


def test_and_back_to_eagle_when_the_load_falls() -> None:
    # Lines crossing at 3 requests: EAGLE 1 + n, plain 2.5 + 0.5n (tau 3).
    e, p = TpotLine(1.0, 1.0), TpotLine(2.5, 0.5)
    young = [eagle(line=e), plain(inflight=1, line=p, remaining=0.99)]
    assert choose(young, {"g0": 1.0}) == ("plain-g0", "adaptive_group_stay")
    draining = [eagle(line=e), plain(inflight=1, line=p, remaining=0.01)]
    assert choose(draining, {"g0": 1.0}) == ("eagle-g0", "adaptive_predicted_faster")
    assert choose([eagle(line=e), plain(inflight=4, line=p)], {"g0": 4.0})[0] == "plain-g0"


def test_speculation_wins_at_every_load_on_llama() -> None:
    backends = [eagle(f"g{i}", 16, line=LLAMA_E, tau=2.9) for i in range(8)]
    backends += [plain(f"g{i}", line=LLAMA_P) for i in range(8)]
    backends[3] = eagle("g3", 15, line=LLAMA_E, tau=2.9)
    assert choose(backends, {f"g{i}": 16.0 for i in range(8)}) == ("eagle-g3", "adaptive_predicted_faster")


def test_the_eagle_cap_is_respected() -> None:
    assert choose([eagle(inflight=4, cap=4, line=LLAMA_E), plain(line=LLAMA_P)]) == ("plain-g0", "adaptive_cap")
    # A capped group's load still counts: the other group's EAGLE server takes the request.
    backends = [eagle("g0", 4, cap=4, line=LLAMA_E), plain("g0", line=LLAMA_P), eagle("g1", 3, line=LLAMA_E), plain("g1", line=LLAMA_P)]
    assert choose(backends) == ("eagle-g1", "adaptive_predicted_faster")
    # Not stuck in a capped mode either: a full EAGLE server is no reason to stay.
    assert choose([eagle(inflight=4, cap=4, remaining=1.0), plain()])[0] == "plain-g0"


def test_unavailable_backends_are_skipped() -> None:
    assert choose([eagle(available=False), plain()]) == ("plain-g0", "adaptive_unavailable")
    backends = [eagle("g0"), plain("g0"), eagle("g1", available=False), plain("g1", available=False)]
    assert choose(backends, {"g0": 1.0}) == ("eagle-g0", "adaptive_predicted_faster")
    # A group whose plain server is down is its EAGLE server alone, priced at its own load.
    backends = [eagle("g0", 2), plain("g0", available=False), eagle("g1", 2), plain("g1", 2)]
    assert choose(backends)[0] == "eagle-g0"
    with pytest.raises(ValueError):
        choose([eagle(available=False), plain(available=False)])


@pytest.mark.parametrize(("n_e", "n_p"), [(0, 0), (0, 3), (1, 1), (2, 5), (3, 2), (5, 9)])
def test_groups_of_one_follow_the_partitioned_rule(n_e: int, n_p: int) -> None:
    backends = [eagle("a", n_e), plain("b", n_p)]
    expected = "eagle-a" if FIELD_E.at(n_e + 1) < FIELD_P.at(n_p + 1) else "plain-b"
    assert choose(backends, {"a": 10.0, "b": 10.0}) == (expected, "adaptive_predicted_faster")


def test_before_the_lines_are_fitted_a_lone_request_speculates() -> None:
    assert choose([eagle(line=None), plain(line=None)]) == ("eagle-g0", "adaptive_prior")
    assert choose([eagle(inflight=1, line=None), plain(line=None)]) == ("plain-g0", "adaptive_prior")
    backends = [eagle("g0", 1, line=None), plain("g0", line=None), eagle("g1", line=None), plain("g1", line=None)]
    assert choose(backends) == ("eagle-g1", "adaptive_prior")
