"""The `shared-prefix` dataset: SGLang bench_serving's generated-shared-prefix.

`groups` system prompts, each shared by `prompts_per_group` requests that add a question of their
own (python/sglang/benchmark/datasets/generated_shared_prefix.py; the option names and defaults
are bench_serving's `--gsp-*`). System prompt, question and output lengths are drawn by the
length distribution (bench_serving's `--gsp-range-ratio`), and the requests are shuffled. A level
sends every one of the groups x prompts per group requests. On chat the system prompt is a system
message, on completions a prefix before a blank line (bench_serving's `f"{system}\\n\\n{question}"`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from loadtest.workloads.arrivals import schedule
from loadtest.workloads.level import Draw
from loadtest.workloads.plan import Plan, Session, Turn


@dataclass(frozen=True)
class SharedPrefix:
    """bench_serving's generated-shared-prefix dataset, with its defaults."""

    name: ClassVar[str] = "shared-prefix"

    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256

    def __post_init__(self) -> None:
        if min(self.num_groups, self.prompts_per_group, self.question_len, self.output_len) < 1:
            raise ValueError("groups, prompts per group, question and output lengths must be at least 1")
        if self.system_prompt_len < 0:
            raise ValueError(f"the system prompt length cannot be negative, got {self.system_prompt_len}")

    def plan(self, draw: Draw) -> Plan:
        """The level's plan: every group's requests, shuffled."""
        rng = draw.rng(self.name)
        sessions = []
        for group in range(self.num_groups):
            system = draw.words(f"system{group}", self.system_prompt_len, rng)
            for prompt in range(self.prompts_per_group):
                question = draw.words(f"question{group}.{prompt}", self.question_len, rng)
                sessions.append(Session((Turn(question, draw.lengths.draw(rng, self.output_len)),), system=system))
        rng.shuffle(sessions)
        return schedule(sessions, draw)

    def settings(self) -> dict[str, Any]:
        """The dataset's options under bench_serving's names, for results.json."""
        return {"name": self.name, **{f"gsp_{k}": v for k, v in asdict(self).items()}}
