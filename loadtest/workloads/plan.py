"""The plan of one load level: sessions of turns, when each starts, what each turn says and asks for.

A plan is plain data, made before anything is sent and the same for every target: the sweep
executes it over HTTP (`loadtest.load.run_plan`), and a model of the server can run the very same
plan in virtual time. A one-request dataset is sessions of one turn. A conversation's turns wait
for each other: a turn is sent `think_s` after the previous turn's answer came back, and re-sends
the whole conversation so far, that answer included (`Session.request`), so only the executor,
which has the answers, can make its request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.records import Exchange, RequestSpec
from loadtest.workloads.text import Text, render, token_count
from tokencount import count_tokens


@dataclass(frozen=True)
class Turn:
    """One request of a session: the user text it adds, the tokens to generate, the think time before it."""

    user: Text
    output_len: int
    think_s: float = 0.0  # seconds from the previous turn's answer to this turn (0 for the first turn)

    @property
    def input_len(self) -> int:
        """Tokens of the user text (tokencount's rule)."""
        return token_count(self.user)


@dataclass(frozen=True)
class Session:
    """A user's conversation: turns sent one after another, a system prompt, a tier, a start time.

    `start_s`: when the first turn is due, seconds from the level's start (open loop; a closed
    loop starts sessions as slots free up). `system`: sent before every turn (empty: none).
    `tier`: OpenAI's `service_tier` of every turn (None: not sent).
    """

    turns: tuple[Turn, ...]
    start_s: float = 0.0
    system: Text = ()
    tier: str | None = None

    def request(self, turn: int, answers: Sequence[str]) -> RequestSpec:
        """Turn `turn`'s request, given the texts the server answered to turns 0 .. turn-1."""
        if len(answers) != turn:
            raise ValueError(f"turn {turn} follows {turn} answers, got {len(answers)}")
        now = self.turns[turn]
        history = tuple(Exchange(render(t.user), a) for t, a in zip(self.turns[:turn], answers, strict=True))
        tokens = token_count(self.system) + now.input_len
        tokens += sum(t.input_len + count_tokens(a) for t, a in zip(self.turns[:turn], answers, strict=True))
        return RequestSpec(
            prompt=render(now.user), input_len=tokens, output_len=now.output_len,
            system=render(self.system), history=history, tier=self.tier,
        )


@dataclass(frozen=True)
class Plan:
    """Everything one level sends.

    `concurrency`: closed loop, this many sessions at a time, the next one started as one ends;
    None: open loop, each session at its `start_s`. `offered_request_s`: the requests per second
    an open-loop level offers (requests over the span they are offered in), None for a closed loop.
    """

    sessions: tuple[Session, ...]
    concurrency: int | None = None
    offered_request_s: float | None = None

    @property
    def requests(self) -> int:
        """Requests the level sends (every turn of every session)."""
        return sum(len(s.turns) for s in self.sessions)

    @property
    def mean_output_len(self) -> float:
        """Mean output tokens per request."""
        return sum(t.output_len for s in self.sessions for t in s.turns) / max(self.requests, 1)
