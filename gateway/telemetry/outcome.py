"""How one proxied exchange ended, as the proxy saw it: what its spans and its access-log line report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs several times more, per request
class Outcome:
    """How an exchange ended, as the proxy saw it (None: it did not get that far); built once, read once."""

    status: int  # what the client got; 499: it left first
    backend: str | None = None
    group: str | None = None
    speculative: bool | None = None
    rule: str | None = None  # the rule of the decision that placed it (failover_retry after a failover)
    failover: bool = False
    predicted_tpot: float | None = None  # seconds; the policy's, for the backend it chose (sampled requests)
    upstream_status: int | None = None
    usage: dict[str, Any] | None = None
    first_token_at: float | None = None  # time.monotonic(); streams only
    token_chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None  # how the upstream exchange failed, when it did
    client_gone: bool = False
    moved_from: str | None = None  # the backend its stream started on (or was first sent to), when another answered it
