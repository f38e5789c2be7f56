"""A validated generation request, ready to route: what the routes build and the proxy carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.dialects.openai import OPENAI, Dialect
from gateway.edge.tenants import Tenant
from gateway.policies import Decision, Prompt
from gateway.pool.prefix import PromptKey
from gateway.pool.snapshot import PoolSnapshot
from gateway.tiers import DEFAULT, Tier


@dataclass
class ProxyJob:
    """A validated generation request, ready to route."""

    endpoint: str  # metric label: "chat", "completions", "generate", "responses", "ollama_chat", ...
    path: str  # upstream path
    body: dict[str, Any]  # the client's JSON, forwarded with `model` rewritten
    stream: bool
    client_wants_usage: bool
    forced: str | None  # x-specgate-route, or the backend holding the response a follow-up names
    request_id: str
    arrived_at: float  # time.monotonic() when the request reached the gateway
    dialect: Dialect = OPENAI  # the API's body, response and stream formats
    weight: int = 1  # sequences it runs upstream: its in-flight count (a batched /generate holds more)
    prepare: Callable[[dict[str, Any], str], None] | None = None  # adjusts the body sent to a backend (by name)
    on_accepted: Callable[[str], None] | None = None  # called with the backend's name once it answered 200
    tier: Tier = DEFAULT  # the service tier it is served as
    echo_tier: bool = False  # the client named a tier (or its tenant's ceiling lowered it): the body says which it got
    tenant: Tenant | None = None  # the named tenant its key belongs to
    # Set by admission: the decision that placed it (a failover's replaces the first) and the pool it read.
    decision: Decision | None = None
    decided_on: PoolSnapshot | None = None
    prefix: PromptKey | None = None  # its prompt's block keys, when it has one prompt
    prompt: Prompt | None = None  # what the policy was told of the prompt when it was routed

    @property
    def max_tokens(self) -> int | None:
        """The client's limit on output tokens, when it gave one (the routing policy's expected length)."""
        return self.dialect.max_tokens(self.body)


def choices(body: dict[str, Any]) -> int:
    """The sequences an OpenAI request runs upstream: its `n` (SGLang decodes each choice as a request)."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
