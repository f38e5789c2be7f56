"""SMG's cache_aware policy (PyPI `smg` 1.13.0, HTTP workers, every knob at its default) as a vnode `Router`.

The baselines' `+smg` targets run behind it, as the real envelope runs them behind `smg launch
--policy cache_aware` (`loadtest.envelope.smg`). What it emulates, from SMG's
`model_gateway/src/policies/cache_aware.rs` and `least_load.rs` of that release:

- **Eligibility.** A worker whose last load report shows `worker_overload_waiting_requests` (8)
  waiting requests or `worker_overload_token_usage` (0.8) KV usage is passed over while another is
  not (SMG's worker overload protection). The KV-pressure imbalance triggers are off at their 1.0
  default, so cache affinity is never abandoned fleet-wide.
- **The approximate tree.** One radix tree of the request *text* (characters, not tokens: over
  HTTP SMG keys on the chat messages' contents joined by spaces), each node knowing which workers
  were sent a text through it. A request's match rate is its longest matched prefix over its
  length; the holders are the workers at the end of that match.
- **The decision.** Match rate above `cache_threshold` (0.3): the holders, less any that trip the
  per-request spill gate (in-flight above `balance_rel_threshold` (1.5) x the eligible mean AND
  `balance_abs_threshold` (64) above it); if every holder trips it, the eligible workers that do
  not (all of them if none). Otherwise (a miss): every eligible worker. Among those candidates the
  LeastLoad expected-wait winner, ties (within 1 us) drawn uniformly. The text is then inserted
  for the chosen worker.
- **Expected wait.** `(queued + running x p + since-poll dispatches x p) / throughput + 0.15 k/(1-k)`
  seconds, from each worker's last `/v1/loads` report (waiting uncached prompt tokens, running
  requests, generation throughput, KV usage k), polled every `load_interval` seconds; `p` is the
  mean prefill estimate (1024 tokens) an HTTP request is credited with, `throughput` the reported
  one or 2000 tok/s when it reports none. Before the first report (a dark fleet) the least
  in-flight worker wins.

Not modelled: tree eviction (its bound, 64 M characters, is far beyond a run's texts), the
event-driven and hash modes (off for HTTP workers at the defaults), retries and the circuit
breaker (no request fails here), health checks. Load reports are read at the first decision on or
after each poll instant, not at the instant itself.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.sim.core import EngineCore
from vnode.requests import Request
from vnode.router import NeverMoves

_TIE_SECONDS = 1e-6  # LeastLoad's TIE_EPSILON_SECS


@dataclass(frozen=True)
class SmgSettings:
    """The cache_aware and LeastLoad knobs `smg launch --policy cache_aware` runs with (1.13.0's defaults).

    `load_interval` is the load poll period in the model's seconds: SMG's 10 wall seconds, divided by a
    real-time run's time scale when the emulation stands for one.
    """

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    load_interval: float = 10.0
    mean_prefill_tokens: int = 1024
    default_throughput: float = 2000.0
    kv_pressure_weight: float = 0.15
    overload_waiting_requests: int = 8
    overload_token_usage: float = 0.8

    def describe(self) -> str:
        """The settings as the report states them."""
        return (f"cache_threshold {self.cache_threshold}, balance_abs_threshold {self.balance_abs_threshold}, "
                f"balance_rel_threshold {self.balance_rel_threshold}, load poll every {self.load_interval:g} s, "
                f"mean prefill {self.mean_prefill_tokens} tokens, default throughput {self.default_throughput:g} tok/s, "
                f"overload at {self.overload_waiting_requests} waiting or {self.overload_token_usage} KV usage")


@dataclass(slots=True, eq=False)
class _Node:
    children: dict[str, tuple[str, _Node]] = field(default_factory=dict)  # first char -> (edge text, child)
    tenants: set[int] = field(default_factory=set)


def _common(edge: str, text: str, at: int) -> int:
    """Characters `edge` shares with `text` from `at`."""
    if text.startswith(edge, at):
        return len(edge)
    n = 0
    for a, b in zip(edge, text[at:at + len(edge)]):
        if a != b:
            break
        n += 1
    return n


class TextTree:
    """SMG's approximate string tree: a radix tree of texts, each node holding the workers sent a text through it."""

    def __init__(self, tenants: Sequence[int]) -> None:
        self.root = _Node(tenants=set(tenants))  # SMG registers every worker with an empty text

    def match(self, text: str) -> tuple[int, set[int]]:
        """The longest prefix of `text` the tree holds (characters) and the workers holding all of it."""
        node, i, holders = self.root, 0, self.root.tenants
        while i < len(text):
            entry = node.children.get(text[i])
            if entry is None:
                break
            edge, child = entry
            n = _common(edge, text, i)
            i += n
            holders = child.tenants
            if n < len(edge):
                break
            node = child
        return i, holders

    def insert(self, text: str, tenant: int) -> None:
        """Record that `tenant` was sent `text`."""
        node, i = self.root, 0
        node.tenants.add(tenant)
        while i < len(text):
            entry = node.children.get(text[i])
            if entry is None:
                node.children[text[i]] = (text[i:], _Node(tenants={tenant}))
                return
            edge, child = entry
            n = _common(edge, text, i)
            if n < len(edge):  # split the edge where the texts part
                middle = _Node({edge[n]: (edge[n:], child)}, set(child.tenants))
                node.children[text[i]] = (edge[:n], middle)
                child = middle
            child.tenants.add(tenant)
            node, i = child, i + n


@dataclass(frozen=True, slots=True)
class _Report:
    """One worker's load report, as LeastLoad reads it."""

    waiting_requests: int
    waiting_uncached_tokens: int
    running_requests: int
    token_usage: float
    gen_throughput: float


def routing_text(request: Request) -> str:
    """What SMG keys a chat request on: its messages' contents joined by spaces."""
    return " ".join(content for _, content in request.messages)


class SmgCacheAwareRouter(NeverMoves):
    """SMG's cache_aware policy in front of a baseline's servers; see the module docstring.

    `engines_attached` gives it the servers' engine cores (read at each load poll) before its first routing;
    `seed` seeds the tie draws, so a run is deterministic.
    """

    def __init__(self, servers: int, settings: SmgSettings = SmgSettings(), seed: int = 0) -> None:
        self.settings = settings
        self.tree = TextTree(range(servers))
        self.inflight = [0] * servers  # SMG's worker load: requests dispatched and not yet ended
        self.since_poll = [0] * servers  # dispatches no report has reflected yet
        self.reports: list[_Report] | None = None  # None: no poll yet (a dark fleet)
        self._cores: Sequence[EngineCore] = ()
        self._next_poll: float | None = None
        self._held: dict[str, int] = {}
        self._rng = random.Random(seed)

    def engines_attached(self, cores: Sequence[EngineCore]) -> None:
        """The servers' engine cores in the router's index order (a view: each poll reads them as they are then)."""
        if len(cores) != len(self.inflight):
            raise ValueError(f"{len(cores)} engines for {len(self.inflight)} workers")
        self._cores = cores

    def route(self, request: Request, now: float) -> int:
        self._poll(now)
        s = self.settings
        eligible = self._eligible()
        text = routing_text(request)
        matched, holders = self.tree.match(text)
        rate = matched / len(text) if text else 0.0
        affinity = [i for i in eligible if i in holders] if rate > s.cache_threshold else []
        if affinity:
            mean = sum(self.inflight[i] for i in eligible) / len(eligible)
            safe = [i for i in affinity if not self._spills(i, mean)]
            candidates = safe or [i for i in eligible if not self._spills(i, mean)] or eligible
        else:
            candidates = eligible
        index = self._expected_wait_winner(candidates)
        self.tree.insert(text, index)
        self.inflight[index] += 1
        self.since_poll[index] += 1
        self._held[request.rid] = index
        return index

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        pass

    def finish(self, request: Request, now: float, output_tokens: int | None, cached_tokens: int = 0) -> None:
        self.inflight[self._held.pop(request.rid)] -= 1


    def _poll(self, now: float) -> None:
        """Take the load reports due by `now` (SMG polls on a fixed period from its first)."""
        if self._next_poll is not None and now < self._next_poll:
            return
        self.reports = [
            _Report(len(core.waiting), core.waiting_uncached_tokens(), len(core.running),
                    core.used_tokens() / core.table.max_total_tokens, core.gen_throughput(now))
            for core in self._cores
        ]
        self.since_poll = [0] * len(self.since_poll)
        step = self.settings.load_interval
        nxt = now + step if self._next_poll is None else self._next_poll
        while nxt <= now:
            nxt += step
        self._next_poll = nxt

    def _eligible(self) -> list[int]:
        """Workers not vetoed by overload protection (every worker when all would be)."""
        everyone = list(range(len(self.inflight)))
        if self.reports is None:
            return everyone
        s = self.settings
        ok = [i for i in everyone if self.reports[i].waiting_requests < s.overload_waiting_requests
              and self.reports[i].token_usage < s.overload_token_usage]
        return ok or everyone

    def _spills(self, index: int, mean: float) -> bool:
        """SMG's per-request count-pressure gate on an affinity candidate."""
        load = self.inflight[index]
        s = self.settings
        return load > mean * s.balance_rel_threshold and load > mean + s.balance_abs_threshold

    def _wait(self, index: int) -> float:
        """LeastLoad's expected-wait score (seconds; a dark fleet: the in-flight count)."""
        if self.reports is None:
            return float(self.inflight[index])
        s, report = self.settings, self.reports[index]
        work = (report.waiting_uncached_tokens + (report.running_requests + self.since_poll[index])
                * s.mean_prefill_tokens)
        rate = report.gen_throughput if report.gen_throughput > 0 else s.default_throughput
        usage = min(report.token_usage, 0.999)
        return work / rate + s.kv_pressure_weight * usage / (1.0 - usage)

    def _expected_wait_winner(self, candidates: Sequence[int]) -> int:
        scores = [(self._wait(i), i) for i in candidates]
        best = min(score for score, _ in scores)
        tied = [i for score, i in scores if score <= best + _TIE_SECONDS]
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)
