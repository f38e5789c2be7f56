"""Metric names a dashboard or alert may query: what specgate exports and what SGLang exports.

specgate's names are read from the gateway's own `GatewayMetrics` (so a renamed metric breaks the
deploy checks, not a dashboard in production); SGLang's come from the 0.5.23 contract
(/work/shared/ref/sglang-contract.md section 2, `srt/observability/metrics_collector.py`).
"""

from __future__ import annotations

import re

from prometheus_client.metrics_core import Metric

from gateway.metrics import GatewayMetrics
from gateway.pool.backends import Backend, Pool

_SGLANG_GAUGES = (
    "num_running_reqs", "num_queue_reqs", "num_grammar_queue_reqs", "gen_throughput", "cache_hit_rate",
    "token_usage", "num_used_tokens", "kv_available_tokens", "kv_used_tokens", "spec_accept_length",
    "spec_accept_rate", "spec_num_steps", "spec_num_draft_tokens", "utilization", "max_total_num_tokens",
    "num_retracted_reqs", "num_paused_reqs", "is_cuda_graph", "context_len", "http_requests_active",
    "startup_time_seconds",
)
_SGLANG_COUNTERS = (
    "num_retracted_requests", "cuda_graph_passes", "realtime_tokens", "prompt_tokens", "generation_tokens",
    "spec_verify_calls", "num_requests", "num_aborted_requests", "cached_tokens", "http_requests",
    "http_responses", "process_cpu_seconds",
)
_SGLANG_HISTOGRAMS = (
    "queue_time_seconds", "per_stage_req_latency_seconds", "time_to_first_token_seconds",
    "inter_token_latency_seconds", "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
    "prompt_tokens_histogram", "generation_tokens_histogram", "get_loads_duration_seconds", "func_latency_seconds",
)

# Series Prometheus itself adds to every scrape target.
_SCRAPE_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

# A metric name in PromQL: specgate's or SGLang's namespace (label names and functions never match).
METRIC_REF = re.compile(r"(?<![\w:])(specgate_[a-z0-9_]+|sglang:[a-z0-9_:]+|up)(?![\w:(])")


def _series_names(family: Metric) -> set[str]:
    if family.type == "counter":
        return {f"{family.name}_total"}
    if family.type == "histogram":
        return {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
    return {family.name}


def specgate_series() -> frozenset[str]:
    """Every series name the gateway can export, including the gauges read live from the pool."""
    metrics = GatewayMetrics()
    pool = Pool([Backend("eagle", "http://eagle", True), Backend("plain", "http://plain", False)])
    metrics.watch(pool, lambda: {"predicted_tpot_seconds": {"eagle": 0.01, "plain": 0.01}, "crossover_concurrency": 2.0})
    names: set[str] = set()
    for family in metrics.registry.collect():
        names |= _series_names(family)
    return frozenset(names)


def sglang_series() -> frozenset[str]:
    """SGLang 0.5.23's series names (gauges, counters with `_total`, histogram series)."""
    names = {f"sglang:{n}" for n in _SGLANG_GAUGES}
    names |= {f"sglang:{n}_total" for n in _SGLANG_COUNTERS}
    names |= {f"sglang:{n}_{s}" for n in _SGLANG_HISTOGRAMS for s in ("bucket", "sum", "count")}
    return frozenset(names)


def known_series() -> frozenset[str]:
    """Everything a query may name."""
    return specgate_series() | sglang_series() | _SCRAPE_SERIES


def referenced_metrics(expr: str) -> set[str]:
    """The specgate/SGLang metric names (and `up`) a PromQL expression selects."""
    return set(METRIC_REF.findall(expr))
