"""What the adaptive policy learns where responses carry no chunk times: a response not streamed (its
usage and life, never a pace or a time to first token it did not see) and the engines' own prefill
counters (`/v1/loads`), which price a prompt's prefix however the client asked for the answer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.policies import Completion, Decision, Prompt
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.adaptive.engine import MIN_STEPS, RATE, EngineSteps, StepReading
from gateway.pool.snapshot import PoolSnapshot
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN
from tests.gateway.test_adaptive_groups import completion, groups, trained, view

# Where the field-8gpu lines cross (tests/gateway/test_adaptive.py): EAGLE is faster below it.
FIELD_CROSSOVER = (FIELD_EAGLE.alpha - FIELD_PLAIN.alpha) / (FIELD_PLAIN.beta - FIELD_EAGLE.beta)


def reporting(snapshot: PoolSnapshot, **counters: tuple[int, int]) -> PoolSnapshot:
    """`snapshot` with backends' engines reporting (uncached tokens prefilled, busy microseconds) so far."""
    views = tuple(replace(v, prefill_tokens=counters[v.name.replace("-", "_")][0], prefill_busy_us=counters[v.name.replace("-", "_")][1])
                  if v.name.replace("-", "_") in counters else v for v in snapshot.backends)
    return PoolSnapshot(views)


def reported(snapshot: PoolSnapshot, totals: dict[str, tuple[float, ...]]) -> PoolSnapshot:
    """`snapshot` with backends' engines reporting these decode moment sums."""
    return PoolSnapshot(tuple(replace(v, decode_moments=totals.get(v.name.replace("-", "_"), v.decode_moments)) for v in snapshot.backends))


def engine_taught(idle: PoolSnapshot) -> tuple[AdaptivePolicy, dict[str, tuple[float, ...]]]:
    """A one-group policy whose backends answered whole and whose engines reported decode steps at loads
    1 to 16, each in turn while the other server was idle: the field-8gpu lines' TPOT (EAGLE: 3 tokens a
    request-step, plain: 1). The first report after the other one's turn spans some of its steps, and is
    not used. Returns it and the moment sums reported last."""
    policy = AdaptivePolicy()
    policy.routed(idle, Decision("g0-eagle", "adaptive_prior"))
    for name in ("g0-eagle", "g0-plain"):  # answered whole: no chunk times
        policy.observe(Completion(name, 64, 0.3, 0.0, 0.0, 0.0, prompt_tokens=100))
    assert not policy.beliefs()["backends"]["g0-eagle"]["points"]
    totals = {"g0_eagle": moments(1, 1, 1.0, 1.0), "g0_plain": moments(1, 1, 1.0, 1.0)}
    policy.routed(reported(idle, totals), Decision("g0-eagle", "adaptive_prior"))
    for name, line, tau in (("g0_eagle", FIELD_EAGLE, 3.0), ("g0_plain", FIELD_PLAIN, 1.0)):
        for n in [*range(1, 17)] * 4:  # each load's band measured a few times
            totals[name] = plus(totals[name], moments(MIN_STEPS, n, 1000 * tau * line.at(n), tau))
            policy.routed(reported(idle, totals), Decision("g0-eagle", "adaptive_prior"))
    return policy, totals


def test_a_response_not_streamed_teaches_its_usage_and_never_a_pace() -> None:
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN)
    observed = policy.beliefs()["backends"]["g0-plain"]["observations"]
    for _ in range(400):  # conversations of four turns, answered whole: a life of 0.9 s, no chunk times
        policy.observe(Completion("g0-plain", 65, 0.9, 0.0, 0.0, 0.0, prompt_tokens=4000, cached_tokens=3000))
    beliefs = policy.beliefs()
    assert beliefs["prefix_hit_share"] == pytest.approx(0.75, abs=0.01)
    assert beliefs["prefix_reuse"] == pytest.approx(3.0, abs=0.2)
    assert beliefs["backends"]["g0-plain"]["observations"] == observed  # no decode window: no point of its curve
    assert beliefs["prefill_seconds_per_token"] == {}  # a 65-token answer's life is not its time to first token
    # A one-token answer's life is: its prompt's prefill (1,000 uncached tokens in 0.1 s).
    policy.observe(Completion("g0-plain", 1, 0.1, 0.0, 0.0, 0.0, prompt_tokens=1000))
    assert policy.beliefs()["prefill_seconds_per_token"] == {"plain": pytest.approx(1e-4)}


def test_the_engines_prefill_counters_price_a_prefix_where_no_response_streams() -> None:
    # The field group of test_adaptive_groups' conversation test, its curves from its engines: the
    # conversation is cached on the plain server, and at 0.1 ms a token EAGLE's prefill of 1,500 more
    # tokens costs more than its faster decode of 128 saves.
    idle = groups((0, 0))
    policy, steps = engine_taught(idle)
    prompt = Prompt(1600.0, {"g0-plain": 1600.0, "g0-eagle": 100.0}, max_tokens=128)
    assert policy.choose(idle, prompt=prompt).decodes_on == "g0-eagle"  # no prefill cost known: the load alone decides
    for tokens in (5_000, 5_100, 10_000, 20_000):  # successive reports; 100 more tokens are too few to read
        busy = 100 * tokens if tokens != 5_100 else 5_000 * 100 + 100 * 900  # 0.1 ms a token, 0.9 over the 100
        policy.routed(reporting(reported(idle, steps), g0_eagle=(tokens, busy), g0_plain=(tokens, busy)), Decision("g0-eagle", "adaptive_prior"))
    beliefs = policy.beliefs()
    assert beliefs["engine_prefill_seconds_per_token"] == {"eagle": pytest.approx(1e-4), "plain": pytest.approx(1e-4)}
    assert beliefs["prefill_seconds_per_token"] == beliefs["engine_prefill_seconds_per_token"]
    assert policy.choose(idle, prompt=prompt) == Decision("g0-plain", "adaptive_prefix_beside")

    # A restarted engine counts from 0 again: its next report is a new start, not a negative reading.
    policy.routed(reporting(idle, g0_eagle=(300, 90_000)), Decision("g0-eagle", "adaptive_prior"))
    assert policy.beliefs()["engine_prefill_seconds_per_token"]["eagle"] == pytest.approx(1e-4)
    policy.routed(reporting(idle, g0_eagle=(10_300, 90_000 + 10_000 * 300)), Decision("g0-eagle", "adaptive_prior"))
    assert policy.beliefs()["engine_prefill_seconds_per_token"]["eagle"] == pytest.approx(1e-4 + RATE * 2e-4)

    # Once responses stream, their times to first token price prefixes (what a prefill delays, queueing
    # included), and where those prompts are short they price none: such a prefill is mostly its step.
    policy.observe(completion("g0-plain", FIELD_PLAIN, 1.0))
    assert policy.beliefs()["prefill_seconds_per_token"] == {}
    for _ in range(5):
        policy.observe(Completion("g0-plain", 65, 0.4, 64 * FIELD_PLAIN.at(1), 1.0, 1.0, prompt_tokens=2000))
    assert policy.beliefs()["prefill_seconds_per_token"] == {"plain": pytest.approx(2e-4)}


def moments(steps: int, batch: int, step_ms: float, per_request: float) -> tuple[float, ...]:
    """SGLang's decode moment sums after `steps` steps of `batch` requests taking `step_ms` each, every
    request gaining `per_request` tokens a step."""
    us = step_ms * 1000.0
    return (steps, steps * batch, steps * us, steps * batch * batch, steps * batch * us, steps * batch * per_request)


def plus(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def test_engine_steps_read_the_mean_batch_and_the_time_per_token_between_reports() -> None:
    steps = EngineSteps()
    eagle = view("g0", "eagle")
    first = moments(100, 2, 8.0, 1.0)
    assert steps.read(replace(eagle, decode_moments=first), others=0.0) is None  # the first report: a baseline
    later = plus(first, moments(MIN_STEPS - 1, 4, 12.0, 3.0))
    assert steps.read(replace(eagle, decode_moments=later), others=0.0) is None  # too few steps since
    later = plus(later, moments(1, 4, 12.0, 3.0))
    reading = steps.read(replace(eagle, decode_moments=later), others=0.0)
    # 16 steps of 4 requests in 12 ms, each request gaining 3 tokens a step: 4 ms a token.
    assert reading == StepReading(4.0, pytest.approx(0.004), 16 * 4 * 3, 16 * 4, alone=True)
    # The other server of the group reported steps meanwhile: the reading says so.
    again = plus(later, moments(20, 1, 5.0, 3.0))
    reading = steps.read(replace(eagle, decode_moments=again), others=7.0)
    assert reading is not None and not reading.alone and reading.batch == 1.0
    # A restarted engine counts from 0: its report is a new baseline, never a negative reading.
    assert steps.read(replace(eagle, decode_moments=moments(3, 1, 5.0, 3.0)), others=7.0) is None


def test_backends_whose_responses_are_never_streamed_learn_their_curves_from_their_engines() -> None:
    idle = groups((0, 0))
    policy, totals = engine_taught(idle)
    beliefs = policy.beliefs()["backends"]
    assert beliefs["g0-eagle"]["tau"] == pytest.approx(3.0) and beliefs["g0-plain"]["tau"] == pytest.approx(1.0)
    assert policy.crossover() == pytest.approx(FIELD_CROSSOVER, rel=0.1)
    assert policy.choose(groups((0, 0))).backend == "g0-eagle"  # a lone request speculates
    assert policy.choose(groups((0, 7))).backend == "g0-plain"  # 8 in flight decode plain
    # Once a backend's responses stream, the streams teach it and its engine's steps no longer do.
    observed = beliefs["g0-plain"]["observations"]
    policy.observe(completion("g0-plain", FIELD_PLAIN, 4.0))
    totals["g0_plain"] = plus(totals["g0_plain"], moments(MIN_STEPS, 2, 1000 * FIELD_PLAIN.at(2), 1.0))
    policy.routed(reported(idle, totals), Decision("g0-eagle", "adaptive_prior"))
    assert policy.beliefs()["backends"]["g0-plain"]["observations"] == observed + 1


def test_a_colocated_backends_engine_steps_count_only_while_the_other_server_ran_none() -> None:
    policy = AdaptivePolicy()
    idle = groups((0, 0))
    policy.routed(idle, Decision("g0-eagle", "adaptive_prior"))
    policy.observe(Completion("g0-plain", 64, 0.3, 0.0, 0.0, 0.0))
    totals = {"g0_eagle": moments(1, 1, 1.0, 1.0), "g0_plain": moments(1, 1, 1.0, 1.0)}
    policy.routed(reported(idle, totals), Decision("g0-eagle", "adaptive_prior"))
    for name in ("g0_eagle", "g0_plain"):  # both servers decoded: plain's steps took turns with EAGLE's
        totals[name] = plus(totals[name], moments(MIN_STEPS, 4, 10.0, 1.0))
    policy.routed(reported(idle, totals), Decision("g0-eagle", "adaptive_prior"))
    plain = policy.beliefs()["backends"]["g0-plain"]
    assert plain["observations"] == 0 and plain["shared_skipped"] == 1
