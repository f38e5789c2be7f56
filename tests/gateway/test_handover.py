"""A handover: a request placed on an EAGLE server whose group's plain server holds far more of its prompt
is answered its first token there and decoded on EAGLE (rules.first_token_server), as a function of
plain data; what the exchange does with it is test_moves_e2e.py's."""

from __future__ import annotations

from dataclasses import replace

from gateway.config import PolicyConfig
from gateway.policies import Completion, Decision, Prompt, route
from gateway.policies.adaptive import AdaptivePolicy
from gateway.policies.adaptive.rules import first_token_server
from gateway.pool.snapshot import BackendView, PoolSnapshot
from gateway.tiers import DEFAULT, Tier
from tests.gateway.test_adaptive import FIELD_EAGLE, FIELD_PLAIN
from tests.gateway.test_adaptive_groups import groups, trained
from tests.gateway.test_group_choice import eagle, plain

# The conversation of test_adaptive_groups: 1,600 tokens, all of them cached on the plain server.
CONVERSATION = Prompt(1600.0, {"g0-plain": 1600.0, "g0-eagle": 100.0}, max_tokens=128)


def test_the_server_holding_the_prefix_answers_the_first_token_when_it_prefills_a_third_or_less() -> None:
    group = [eagle(), plain()]
    assert first_token_server(group[0], group, {"eagle-g0": 1500.0, "plain-g0": 0.0}) == "plain-g0"
    assert first_token_server(group[0], group, {"eagle-g0": 1500.0, "plain-g0": 499.0}) == "plain-g0"
    # Holding a little more than EAGLE does not pay for a handover.
    assert first_token_server(group[0], group, {"eagle-g0": 1500.0, "plain-g0": 600.0}) is None
    assert first_token_server(group[0], group, {"eagle-g0": 0.0, "plain-g0": 0.0}) is None


def test_only_a_request_for_eagle_is_handed_over_and_only_within_its_group_to_a_live_server() -> None:
    group = [eagle(), plain()]
    assert first_token_server(group[1], group, {"eagle-g0": 0.0, "plain-g0": 1500.0}) is None
    down = [eagle(), plain(available=False)]
    assert first_token_server(down[0], down, {"eagle-g0": 1500.0, "plain-g0": 0.0}) is None
    other_group = [eagle("g0"), plain("g1")]
    assert first_token_server(other_group[0], other_group, {"eagle-g0": 1500.0, "plain-g1": 0.0}) is None


def taught(**kwargs: object) -> AdaptivePolicy:
    """A field group whose prefill is known (0.1 ms a token) and whose prompts build on each other: EAGLE
    is worth the conversation's prefill (test_adaptive_groups)."""
    policy = trained(1, FIELD_EAGLE, FIELD_PLAIN, **kwargs)
    for _ in range(400):
        policy.observe(Completion("g0-plain", 65, 0.1, 64 * FIELD_PLAIN.at(1), 1.0, 1.0, prompt_tokens=4000, cached_tokens=3000))
    return policy


def test_the_policy_hands_a_conversation_over_unless_told_not_to() -> None:
    idle = groups((0, 0))
    decision = taught().choose(idle, prompt=CONVERSATION)
    assert (decision.backend, decision.then, decision.decodes_on) == ("g0-plain", "g0-eagle", "g0-eagle")
    for off in (PolicyConfig(adaptive_handover=False), PolicyConfig(adaptive_move_running=False)):
        config = {"handover": off.adaptive_handover, "move_running": off.adaptive_move_running}
        assert taught(**config).choose(idle, prompt=CONVERSATION) == Decision("g0-eagle", decision.reason)
    assert AdaptivePolicy.from_config(PolicyConfig(adaptive_handover=False)).describe()["handover"] is False
    # A one-token answer is its first token: nothing to hand over.
    one = Prompt(1600.0, CONVERSATION.cached, max_tokens=1)
    assert taught().choose(idle, prompt=one).then is None


def test_the_group_records_the_server_that_decodes() -> None:
    policy = taught()
    idle = groups((0, 0))
    decision = policy.choose(idle, prompt=CONVERSATION)
    policy.routed(idle, decision)
    policy.attach(lambda: idle)
    assert policy.beliefs()["groups"]["g0"]["last_decision"] == f"g0-eagle: {decision.reason}"


def test_route_starts_a_request_on_the_server_it_would_be_handed_over_to_when_its_stream_cannot_move() -> None:
    policy = taught()
    idle = groups((0, 0))
    handed = route(policy, idle, prompt=CONVERSATION, handover=True)
    assert handed is not None and (handed.backend, handed.then) == ("g0-plain", "g0-eagle")
    kept = route(policy, idle, prompt=CONVERSATION, handover=False)
    assert kept is not None and (kept.backend, kept.then) == ("g0-eagle", None)
    eagle_down = PoolSnapshot(tuple(v if v.name != "g0-eagle" else _down(v) for v in idle.backends))
    assert route(HandingOver(), eagle_down, handover=True) == Decision("g0-plain", "test")


class HandingOver(AdaptivePolicy):
    """Hands every request over from g0's plain server to its EAGLE one."""

    def choose(self, snapshot: PoolSnapshot, tier: Tier = DEFAULT, prompt: Prompt | None = None) -> Decision:
        return Decision("g0-plain", "test", tier, then="g0-eagle")


def _down(view: BackendView) -> BackendView:
    return replace(view, available=False)
