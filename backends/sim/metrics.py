"""Prometheus metrics of one simulated server: SGLang's `sglang:` names and labels, in its own registry.

Scheduler gauges are read from the engine when scraped, so they are always current (SGLang refreshes
them only every 40 decode steps; being fresher never misleads a reader). Latencies are observed in
wall-clock (scaled) time: at `--time-scale 0.1` a modelled 1 s TTFT reads 0.1 s.
Besides SGLang's metrics the simulator exports its fidelity check: `sglang:sim_schedule_slip_seconds`
(total lateness of steps against their modelled end) with `sglang:sim_steps_total` beside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.sim.engine import Engine
from backends.sim.request import SimRequest

_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
)
_ITL_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
)
_E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)


class _SchedulerCollector(Collector):
    """SGLang's scheduler gauges, computed from the engine at scrape time."""

    def __init__(self, engine: Engine, labels: dict[str, str], context_length: int) -> None:
        self.engine = engine
        self.labels = labels
        self.context_length = context_length

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        core = engine.core
        table = core.table
        running = len(core.running)
        used, evictable = core.used_tokens(), core.evictable_tokens()
        capacity = table.max_total_tokens
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", running)
        yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(core.waiting))
        yield self._gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0)
        yield self._gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", core.gen_throughput(time.monotonic())
        )
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", core.cache_hit_rate)
        yield self._gauge("sglang:token_usage", "The token usage.", used / capacity)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield self._gauge("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", used)
        yield self._gauge(
            "sglang:kv_evictable_tokens",
            "Number of evictable (radix-cached) token slots in the KV cache pool.",
            evictable,
        )
        yield self._gauge(
            "sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.", capacity - used - evictable
        )
        yield self._gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache.", capacity)
        yield self._gauge(
            "sglang:utilization", "Share of the running-request capacity in use.", running / table.max_running_requests
        )
        yield self._gauge("sglang:num_retracted_reqs", "The number of retracted requests.", 0)
        yield self._gauge("sglang:num_paused_reqs", "The number of paused requests.", 0)
        yield self._gauge("sglang:is_cuda_graph", "Whether the batch ran with a CUDA graph.", 1)
        yield self._gauge("sglang:context_len", "The context length of the model.", self.context_length)
        if table.speculative:
            accept = core.accept_length()
            drafting = core.steps.speculating(max(core.last_batch, 1))
            yield self._gauge(
                "sglang:spec_accept_length", "The average acceptance length of speculative decoding.", accept
            )
            yield self._gauge(
                "sglang:spec_accept_rate",
                "The average acceptance rate of speculative decoding.",
                (accept - 1.0) / (table.num_draft_tokens - 1),
            )
            yield self._gauge(
                "sglang:spec_num_steps",
                "Draft steps per verify step in the last batch.",
                table.num_draft_tokens - 1 if drafting else 0,
            )
            yield self._gauge("sglang:spec_num_draft_tokens", "Draft tokens per verify step.", table.num_draft_tokens)
        yield self._counter("sglang:num_retracted_requests", "Total retracted requests.", 0)
        yield self._counter(
            "sglang:sim_schedule_slip_seconds",
            "Simulator fidelity: total lateness of steps against their modelled end.",
            engine.slip_seconds,
        )
        yield self._counter("sglang:sim_steps", "Simulator: steps run.", core.num_steps)
        yield self._gauge(
            "sglang:sim_schedule_lag_seconds", "Simulator: lateness of the last step.", engine.last_lag_seconds
        )


class SimMetrics:
    """All metrics of one simulated server; also the engine's observer and the HTTP middleware's sink."""

    def __init__(self, engine: Engine, *, model_name: str, context_length: int, extra_labels: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        base = {"model_name": model_name, "engine_type": "unified"}
        scheduler_labels = {**base, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0", **extra_labels}
        self.registry.register(_SchedulerCollector(engine, scheduler_labels, context_length))

        tokenizer = {**base, **extra_labels}
        names = [*tokenizer, "is_streaming"]
        reg = self.registry
        prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", names, registry=reg)
        generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", names, registry=reg
        )
        num_requests = Counter("sglang:num_requests", "The number of processed requests.", names, registry=reg)
        ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Time to first token.", names, registry=reg, buckets=_TTFT_BUCKETS
        )
        tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Time per output token of a request.",
            names,
            registry=reg,
            buckets=_ITL_BUCKETS,
        )
        e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end request latency.",
            names,
            registry=reg,
            buckets=_E2E_BUCKETS,
        )
        # Children bound once per is_streaming value: the observer runs on every token.
        self._by_stream = {
            flag: (
                prompt_tokens.labels(*tokenizer.values(), value),
                generation_tokens.labels(*tokenizer.values(), value),
                num_requests.labels(*tokenizer.values(), value),
                ttft.labels(*tokenizer.values(), value),
                tpot.labels(*tokenizer.values(), value),
                e2e.labels(*tokenizer.values(), value),
            )
            for flag, value in ((True, "true"), (False, "false"))
        }
        self._itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Inter-token latency.",
            list(tokenizer),
            registry=reg,
            buckets=_ITL_BUCKETS,
        ).labels(*tokenizer.values())
        self._aborted = Counter(
            "sglang:num_aborted_requests", "Number of aborted requests.", list(tokenizer), registry=reg
        ).labels(*tokenizer.values())
        self._spec_verify = Counter(
            "sglang:spec_verify_calls", "Speculative verify steps.", list(tokenizer), registry=reg
        ).labels(*tokenizer.values())
        # SGLang labels cached tokens by source only with its hierarchical cache; a radix cache alone is "total".
        self._cached = Counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*tokenizer, "cache_source"],
            registry=reg,
        ).labels(*tokenizer.values(), "total")

        self._extra = list(extra_labels.values())
        http_names = [*extra_labels, "endpoint", "method"]
        self.http_requests = Counter("sglang:http_requests", "HTTP requests received.", http_names, registry=reg)
        self.http_responses = Counter(
            "sglang:http_responses", "HTTP responses sent.", [*http_names, "status_code"], registry=reg
        )
        self.http_active = Gauge(
            "sglang:http_requests_active",
            "HTTP requests in progress, streams included.",
            http_names,
            registry=reg,
            multiprocess_mode="livesum",
        )

    def http_labels(self, endpoint: str, method: str) -> list[str]:
        """Label values of the HTTP metrics for one route."""
        return [*self._extra, endpoint, method]

    # ----- EngineObserver -----

    def first_token(self, req: SimRequest, at: float) -> None:
        self._by_stream[req.is_streaming][3].observe(at - req.arrived_at)

    def tokens(self, req: SimRequest, count: int, interval: float) -> None:
        per_token = interval / count
        for _ in range(count):
            self._itl.observe(per_token)

    def finished(self, req: SimRequest, at: float) -> None:
        prompt, generation, requests, _, tpot, e2e = self._by_stream[req.is_streaming]
        prompt.inc(req.prompt_tokens)
        generation.inc(req.produced)
        requests.inc()
        e2e.observe(at - req.arrived_at)
        if req.produced > 1 and req.first_token_at is not None:
            tpot.observe((at - req.first_token_at) / (req.produced - 1))
        if req.verify_steps:
            self._spec_verify.inc(req.verify_steps)
        if req.cached_tokens:
            self._cached.inc(req.cached_tokens)
        if req.state == "aborted":
            self._aborted.inc()
