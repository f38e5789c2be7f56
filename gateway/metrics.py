"""Prometheus metrics of the gateway (names are a contract; dashboards and alerts use them).

Gauges that mirror pool state (in-flight, backend up) and the policy's beliefs are read from the
live objects at scrape time by a collector, so the request path never updates them and they can
never drift from the truth.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.pool.backends import Pool
from gateway.tiers import TIERS

# Latency buckets spanning a sub-millisecond gateway hop to multi-minute queueing under overload.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
M = TypeVar("M", Counter, Histogram)
CLIENT_PHASES = ("head", "body")  # what a client was too slow to send (specgate_client_timeouts_total)


class Labelled(Generic[M]):
    """A labelled metric whose child per label set is looked up once.

    prometheus_client's `labels()` validates, converts and locks on every call, several times a
    proxied request (docs/benchmarks/design-notes.md#metrics).
    """

    __slots__ = ("metric", "_children")

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        """The child for these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class _PoolCollector(Collector):
    def __init__(self, pool: Pool, policy_beliefs: Callable[[], dict[str, Any]]) -> None:
        self._pool = pool
        self._beliefs = policy_beliefs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # A worker that has served nothing since the health checker's last change still reports it.
        self._pool.sync()
        inflight = GaugeMetricFamily("specgate_inflight_requests", "Requests routed and not yet finished", labels=["backend"])
        up = GaugeMetricFamily("specgate_backend_up", "1 when the backend receives traffic", labels=["backend"])
        group_inflight = GaugeMetricFamily(
            "specgate_group_inflight_requests", "Requests in flight on all backends of a GPU group", labels=["group"]
        )
        group_info = GaugeMetricFamily(
            "specgate_backend_group_info", "The GPU group each backend belongs to (always 1)", labels=["backend", "group", "speculative"]
        )
        per_group: dict[str, int] = {}
        for backend in self._pool:
            inflight.add_metric([backend.name], backend.inflight_total)
            up.add_metric([backend.name], 1.0 if backend.available else 0.0)
            group_info.add_metric([backend.name, backend.group, str(backend.speculative).lower()], 1.0)
            per_group[backend.group] = per_group.get(backend.group, 0) + backend.inflight_total
        for group, count in per_group.items():
            group_inflight.add_metric([group], count)
        yield inflight
        yield up
        yield group_inflight
        yield group_info
        beliefs = self._beliefs()
        predicted = beliefs.get("predicted_tpot_seconds")
        if predicted:
            family = GaugeMetricFamily(
                "specgate_policy_predicted_tpot_seconds",
                "Policy's predicted time per output token for one more request",
                labels=["backend"],
            )
            for name, value in predicted.items():
                family.add_metric([name], value)
            yield family
        crossover = beliefs.get("crossover_concurrency")
        if crossover is not None:
            yield GaugeMetricFamily(
                "specgate_policy_crossover_concurrency",
                "Concurrency above which the policy believes plain decode serves better",
                value=crossover,
            )


class _BudgetCollector(Collector):
    def __init__(self, capacity: Callable[[], int], connections: Callable[[], int]) -> None:
        self._capacity = capacity
        self._connections = connections

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "specgate_inflight_capacity",
            "Requests the open-file limit lets the gateway hold at once (two descriptors each, after the reserve)",
            value=self._capacity(),
        )
        yield GaugeMetricFamily("specgate_client_connections", "Open client connections", value=self._connections())


class GatewayMetrics:
    """Every metric of one gateway instance, in its own registry.

    `multiprocess_dir`: the gateway runs several worker processes (and a parent); each process's
    counters and histograms live in files there (prometheus_client's multiprocess mode) and the
    exposition sums every process's, so any worker's /metrics shows the whole gateway.
    """

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        disable_created_metrics()  # `_created` series double the exposition and no dashboard uses them
        self.registry = CollectorRegistry()
        self._exposed = self.registry
        if multiprocess_dir is not None:
            # This process's values go to files there from here on (prometheus_client reads the class
            # and the directory, a process-wide setting, whenever a series is made).
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiprocess_dir
            # Its pid is read once: prometheus_client asks for it at every update (a getpid() system
            # call, docs/benchmarks/design-notes.md#metrics) to notice a fork, and gateway processes
            # are spawned, never forked after this.
            pid = os.getpid()
            values.ValueClass = values.MultiProcessValue(process_identifier=lambda: pid)
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=multiprocess_dir)
        r = self.registry
        self.requests = Labelled(Counter(
            "specgate_requests", "Finished requests", ["backend", "endpoint", "status"], registry=r
        ))
        self.route_decisions = Labelled(Counter(
            "specgate_route_decisions", "Routing decisions", ["backend", "reason"], registry=r
        ))
        self.ttft = Labelled(Histogram(
            "specgate_time_to_first_token_seconds", "Time to first token", ["backend"], buckets=_LATENCY_BUCKETS, registry=r
        ))
        self.itl = Labelled(Histogram(
            "specgate_inter_token_latency_seconds", "Time between streamed chunks", ["backend"], buckets=_ITL_BUCKETS, registry=r
        ))
        self.duration = Labelled(Histogram(
            "specgate_request_duration_seconds", "End-to-end request time", ["backend"], buckets=_LATENCY_BUCKETS, registry=r
        ))
        self.output_tokens = Labelled(Counter("specgate_output_tokens", "Completion tokens (from usage)", ["backend"], registry=r))
        self.prompt_tokens = Labelled(Counter("specgate_prompt_tokens", "Prompt tokens (from usage)", ["backend"], registry=r))
        self.prefix_hit_tokens = Labelled(Counter(
            "specgate_prefix_hit_tokens", "Prompt tokens the backend reported taking from its prefix cache", ["backend"], registry=r
        ))
        self.prefix_predicted_tokens = Labelled(Counter(
            "specgate_prefix_predicted_tokens",
            "Prompt tokens the gateway's prefix map predicted the backend held when it routed there",
            ["backend"],
            registry=r,
        ))
        self.moves = Labelled(Counter(
            "specgate_moves",
            "Streams moved to another backend, continued mid-answer or, before their first token, sent there whole: "
            "moved by the policy after a routing (switch) or while no request arrives (drain), handed over after "
            "their first token (handover) or after theirs dropped them (resume)",
            ["from", "to", "reason"],
            registry=r,
        ))
        self.upstream_errors = Labelled(Counter(
            "specgate_upstream_errors", "Failures talking to a backend", ["backend", "kind"], registry=r
        ))
        self.overhead = Histogram(
            "specgate_gateway_overhead_seconds",
            "Time spent in the gateway itself: arrival to upstream dispatch, plus response handling",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        # Per service tier (three values), not per backend too: what a tier's clients get, whatever served them.
        self.tier_requests = Labelled(Counter(
            "specgate_tier_requests", "Finished requests per service tier", ["tier", "status"], registry=r
        ))
        self.tier_ttft = Labelled(Histogram(
            "specgate_tier_time_to_first_token_seconds",
            "Time to first token per service tier",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ))
        self.tier_tpot = Labelled(Histogram(
            "specgate_tier_time_per_output_token_seconds",
            "Time per output token (first to last token over tokens - 1) of streamed responses, per service tier",
            ["tier"],
            buckets=_ITL_BUCKETS,
            registry=r,
        ))
        self.restarts = Labelled(Counter("specgate_backend_restarts", "Backend process restarts", ["backend"], registry=r))
        # Per named tenant ([[security.tenants]]: the label's values are bounded by the config, never a key).
        self.tenant_requests = Labelled(Counter(
            "specgate_tenant_requests", "Finished generation requests per tenant", ["tenant", "status"], registry=r
        ))
        self.tenant_tokens = Labelled(Counter(
            "specgate_tenant_tokens", "Tokens per tenant, from usage (kind: prompt, completion)", ["tenant", "kind"], registry=r
        ))
        self.local_errors = Labelled(Counter(
            "specgate_local_errors",
            "Requests refused for the gateway's own resource limits (descriptors, pool, ports), not a backend's",
            ["kind"],
            registry=r,
        ))
        self.client_timeouts = Labelled(Counter(
            "specgate_client_timeouts",
            "Client connections ended for a request head or body not sent in time (limits.client_*_timeout_seconds)",
            ["phase"],
            registry=r,
        ))
        self.client_connections_refused = Counter(
            "specgate_client_connections_refused",
            "Client connections closed at accept: their address held limits.max_connections_per_client already",
            registry=r,
        )

    def watch(self, pool: Pool, policy_beliefs: Callable[[], dict[str, Any]]) -> None:
        """Export the pool's gauges and the policy's beliefs, read live at scrape time."""
        self._exposed.register(_PoolCollector(pool, policy_beliefs))

    def watch_budget(self, capacity: Callable[[], int], connections: Callable[[], int]) -> None:
        """Export the descriptor budget and the open client connections, read live at scrape time."""
        self._exposed.register(_BudgetCollector(capacity, connections))

    def prepare(self, backends: list[str], endpoints: tuple[str, ...]) -> None:
        """Create every per-backend series at zero so dashboards and `rate()` see them from the start."""
        for name in backends:
            self.ttft.labels(name)
            self.itl.labels(name)
            self.duration.labels(name)
            self.output_tokens.labels(name)
            self.prompt_tokens.labels(name)
            self.prefix_hit_tokens.labels(name)
            self.prefix_predicted_tokens.labels(name)
            self.restarts.labels(name)
            for endpoint in endpoints:
                self.requests.labels(name, endpoint, "200")
        for phase in CLIENT_PHASES:
            self.client_timeouts.labels(phase)
        for tier in TIERS:
            self.tier_requests.labels(tier, "200")
            self.tier_ttft.labels(tier)
            self.tier_tpot.labels(tier)

    def prepare_tenants(self, names: list[str]) -> None:
        """Create each tenant's series at zero (served and refused requests, both token kinds)."""
        for name in names:
            for status in ("200", "429"):
                self.tenant_requests.labels(name, status)
            for kind in ("prompt", "completion"):
                self.tenant_tokens.labels(name, kind)

    def exposition(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self._exposed)
