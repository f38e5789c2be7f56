"""A request as the model's routers and servers see it: what the load tool would send, tokenized as the simulator does."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from backends.sim.tokenizer import chat_prompt_ids, chat_prompt_key
from loadtest.records import RequestSpec

Message = tuple[str, str]  # (role, text)


@dataclass(frozen=True, eq=False)
class Request:
    """One chat request: its id, its messages and their token ids, its output limit and service tier.

    `max_tokens` is what the load tool sends (`max_tokens`, with `ignore_eos`: exactly that many
    tokens come back); `service_tier` is OpenAI's field as sent (None: not sent). `prompt_ids` and
    `prompt_key` are the simulator's: the templated prompt's token ids (what a prefix key is made
    of) and the text that chooses where its output starts.
    """

    rid: str
    messages: tuple[Message, ...]
    prompt_ids: list[int]
    prompt_key: str
    max_tokens: int
    service_tier: str | None = None

    @classmethod
    def of(cls, rid: str, spec: RequestSpec) -> Request:
        """The chat request the load tool sends for `spec`."""
        messages = tuple((m["role"], m["content"]) for m in spec.chat_messages())
        ids, key = _tokenized(messages)
        return cls(rid, messages, ids, key, spec.output_len, spec.tier)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the templated prompt."""
        return len(self.prompt_ids)


@lru_cache(maxsize=8192)  # every target of an envelope sends the same prompts: tokenize each once
def _tokenized(messages: tuple[Message, ...]) -> tuple[list[int], str]:
    """The prompt's token ids (shared, never changed: the engine copies what it keeps) and output key."""
    return chat_prompt_ids(messages), chat_prompt_key(messages)
