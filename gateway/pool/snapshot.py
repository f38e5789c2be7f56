"""The pool as a policy sees it: immutable views of every backend at one instant."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BackendView:
    """One backend as a policy sees it."""

    name: str
    speculative: bool
    available: bool
    inflight: int
    group: str = ""  # empty: a group of its own (named after the backend)
    # Over its in-flight requests: the output tokens they are expected to produce in all, and the
    # token-bearing chunks relayed to them so far (a policy turns chunks into tokens).
    expected_tokens: float = 0.0
    relayed_chunks: int = 0
    # Its KV cache's capacity in tokens as its engine last reported it (`/v1/loads`): over all its ranks,
    # and its smallest rank's (the longest request it surely holds). 0: not known.
    kv_tokens: int = 0
    kv_rank_tokens: int = 0
    # Its engine's cumulative prefill counters at its last report: uncached prompt tokens prefilled and the
    # microseconds that took. 0: not known.
    prefill_tokens: int = 0
    prefill_busy_us: int = 0
    # ... and its decode step-time moment sums (`EngineLoad.decode_moments`); None: not known.
    decode_moments: tuple[float, ...] | None = None
    # Over its in-flight requests: the prompt tokens they were sent to prefill there (what the gateway's
    # prefix map predicted its cache lacked). With their expected output, the KV room they hold.
    held_prompt_tokens: float = 0.0
    # The prompt tokens every request routed to it was sent to prefill, ever (a counter; a stream's counted
    # once its first token came from it, its prefill done).
    sent_prompt_tokens: float = 0.0

    def __post_init__(self) -> None:
        if not self.group:
            object.__setattr__(self, "group", self.name)


@dataclass(frozen=True)
class PoolSnapshot:
    """An immutable picture of the pool at one instant; policies are functions of it."""

    backends: tuple[BackendView, ...]
    at: float = field(default=0.0, compare=False)  # the pool's clock when it was taken (not part of the state)

    @property
    def total_inflight(self) -> int:
        return sum(b.inflight for b in self.backends)

    def group_inflight(self, view: BackendView) -> int:
        """The in-flight count of all backends in `view`'s group (its own when it is alone)."""
        return sum(b.inflight for b in self.backends if b.group == view.group)

    def get(self, name: str) -> BackendView:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def speculative(self) -> BackendView:
        return next(b for b in self.backends if b.speculative)

    @property
    def plain(self) -> BackendView:
        return next(b for b in self.backends if not b.speculative)
