"""The `multi-turn` dataset: conversations whose every turn re-sends the whole conversation so far.

Each conversation belongs to one of `tenants` tenants and starts with its tenant's system prompt
(`system_prompt_len` tokens, the same text for all of that tenant's conversations); each of its
`turns` turns adds a user message of `--input-len` tokens and asks for `--output-len` tokens, both
drawn by the length distribution. Turn k re-sends the system prompt, the earlier user messages and
the answers the server actually returned (the executor fills them in), as a chat client does, so a
server's prefix cache sees what it would see in production. A user thinks for an exponentially
drawn time (mean `think_time_s`) between an answer and the next turn.

A level of N requests has ceil(N / turns) conversations, and at least C of them under a closed
loop of C (each slot runs whole conversations back to back). Open loop, conversations start at
1/turns of `--request-rate`, so the level offers that many requests per second.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from loadtest.workloads.arrivals import schedule
from loadtest.workloads.level import Draw
from loadtest.workloads.plan import Plan, Session, Turn


@dataclass(frozen=True)
class MultiTurn:
    """Conversations of `turns` turns over `tenants` tenants' system prompts, with think times."""

    name: ClassVar[str] = "multi-turn"

    turns: int = 4
    think_time_s: float = 1.0
    tenants: int = 4
    system_prompt_len: int = 1024

    def __post_init__(self) -> None:
        if self.turns < 1 or self.tenants < 1:
            raise ValueError("a conversation has at least 1 turn and there is at least 1 tenant")
        if self.think_time_s < 0 or self.system_prompt_len < 0:
            raise ValueError("think time and system prompt length cannot be negative")

    def conversations(self, draw: Draw) -> int:
        """How many conversations the level holds."""
        return max(math.ceil(draw.requests / self.turns), draw.level.concurrency or 1)

    def plan(self, draw: Draw) -> Plan:
        """The level's plan."""
        rng = draw.rng(self.name)
        systems = [draw.words(f"tenant{t}", self.system_prompt_len, rng) for t in range(self.tenants)]
        sessions = []
        for conversation in range(self.conversations(draw)):
            system = systems[rng.randrange(self.tenants)]
            turns = tuple(
                Turn(
                    draw.words(f"user{conversation}.{k}", draw.input_len, rng),
                    draw.lengths.draw(rng, draw.output_len),
                    think_s=rng.expovariate(1.0 / self.think_time_s) if k and self.think_time_s else 0.0,
                )
                for k in range(self.turns)
            )
            sessions.append(Session(turns, system=system))
        return schedule(sessions, draw)

    def settings(self) -> dict[str, Any]:
        """The dataset's options, for results.json."""
        return {"name": self.name, **asdict(self)}
