"""`GET /v1/loads` in SGLang 0.5.23's shape: the node as one worker of a cluster router.

A cluster router (SMG) polls each node's `/v1/loads?include=core,disagg,queues,memory` and sends
a request to the node with the least expected wait: queued token-work over generation throughput,
plus a KV-pressure term. One specgate node is one such worker, so its backends are summed into a
single rank (`dp_rank` 0), never listed as DP ranks: a DP-aware router would then pin requests to
ranks the node does not have.

Request counts come from the gateway's own exact in-flight counts; what only the engines know
(queued requests and tokens, KV usage, throughput, memory) comes from each backend's own
`/v1/loads`, which the health checker fetches every `health.ready_interval` (`Backend.engine_load`), so a router
polling often costs the backends nothing extra.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from gateway import __version__
from gateway.pool.backends import Pool
from gateway.pool.engine_load import as_float, as_int

SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
# Core counters that add up across backends (SGLang reports them as integers), in SGLang's order.
_TOKEN_COUNTS = (
    "num_waiting_uncached_tokens",
    "num_used_tokens",
    "num_total_tokens",
    "num_active_tokens",
    "num_prealloc_ready_tokens",
)
_SUMMED = (
    *_TOKEN_COUNTS,
    "max_total_num_tokens",
    "max_running_requests",
    "total_prefill_uncached_tokens",
    "total_prefill_busy_us",
)
_QUEUES = ("waiting", "grammar", "paused", "retracted", "prealloc_ready")
_PROMETHEUS_PREFIXES = {"speculative": "spec", "disaggregation": "disagg"}


def _section(ranks: Iterable[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r[name] for r in ranks if isinstance(r.get(name), dict)]


def node_entry(pool: Pool, include: set[str] | None) -> dict[str, Any]:
    """The node's one `loads[]` entry: every backend summed, running requests from the gateway's own.

    The queue is the engines' (fetched once a poll): it may hold requests that reached the backends
    past the gateway. Running is the rest of the gateway's exact in-flight count, so while the
    gateway is the backends' only client, running + waiting is that count.
    """
    ranks = [rank for b in pool if b.engine_load is not None for rank in b.engine_load.ranks]
    sums = {key: sum(as_int(r.get(key)) for r in ranks) for key in _SUMMED}
    inflight = pool.total_inflight
    waiting = sum(as_int(r.get("num_waiting_reqs")) for r in ranks)
    running = max(inflight - waiting, 0)
    capacity, slots = sums["max_total_num_tokens"], sums["max_running_requests"]
    hit_rates = [as_float(r.get("cache_hit_rate")) for r in ranks]
    entry: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        **{key: sums[key] for key in _TOKEN_COUNTS},
        "max_total_num_tokens": capacity,
        "max_running_requests": slots,
        "token_usage": round(sums["num_used_tokens"] / capacity, 4) if capacity else 0.0,
        "gen_throughput": round(sum(as_float(r.get("gen_throughput")) for r in ranks), 2),
        "cache_hit_rate": round(sum(hit_rates) / len(hit_rates), 4) if hit_rates else 0.0,
        "utilization": round(running / slots, 4) if slots else 0.0,
        "total_prefill_uncached_tokens": sums["total_prefill_uncached_tokens"],
        "total_prefill_busy_us": sums["total_prefill_busy_us"],
        "decode_moments": None,  # moment sums of different servers' step times do not add up to one server's
    }
    sections = include or {"all"}
    if sections == {"core"}:
        return entry
    every = "all" in sections
    memory = _section(ranks, "memory")
    if memory and (every or "memory" in sections):
        entry["memory"] = {
            **{key: round(sum(as_float(m.get(key)) for m in memory), 3) for key in ("weight_gb", "kv_cache_gb", "graph_gb")},
            "token_capacity": sum(as_int(m.get("token_capacity")) for m in memory),
        }
    spec = _section(ranks, "speculative")
    if spec and (every or "spec" in sections):
        entry["speculative"] = {
            key: round(sum(as_float(s.get(key)) for s in spec) / len(spec), 4) for key in ("accept_length", "accept_rate")
        }
    if every or "disagg" in sections:
        entry["disaggregation"] = _disaggregation(_section(ranks, "disaggregation"))
    if every or "queues" in sections:
        queues = _section(ranks, "queues")
        entry["queues"] = {key: sum(as_int(q.get(key)) for q in queues) for key in _QUEUES}
    return entry


def _disaggregation(reported: list[dict[str, Any]]) -> dict[str, Any]:
    """SGLang's section for a server outside prefill/decode disaggregation, counts summed."""
    counts = (
        "prefill_bootstrap_queue_reqs",
        "prefill_inflight_queue_reqs",
        "decode_prealloc_queue_reqs",
        "decode_transfer_queue_reqs",
        "decode_retracted_queue_reqs",
    )
    return {
        "mode": "null",
        **{key: sum(as_int(d.get(key)) for d in reported) for key in counts},
        "kv_transfer_speed_gb_s": 0.0,
        "kv_transfer_latency_ms": 0.0,
    }


def node_loads(pool: Pool, include: set[str] | None, dp_rank: int | None) -> dict[str, Any]:
    """The whole `/v1/loads` body; `include` already checked against `SECTIONS`."""
    engines = [b.engine_load for b in pool if b.engine_load is not None]
    version = next((e.version for e in engines if e.version), None)
    accelerator = next((e.accelerator for e in engines if e.accelerator), None)
    # Backends of one GPU group share its accelerators: count each group once.
    per_group: dict[str, int] = {}
    for b in pool:
        if b.engine_load is not None:
            per_group[b.group] = max(per_group.get(b.group, 0), b.engine_load.num_accelerators)
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": version or f"specgate-{__version__}",  # a router reads it as a string, never null
        "accelerator": accelerator,
        "num_accelerators": sum(per_group.values()),
        "loads": [node_entry(pool, include)] if dp_rank in (None, 0) else [],
    }


def loads_prometheus(body: dict[str, Any]) -> str:
    """`format=prometheus`: every number of every entry as a gauge `sglang_<key>{dp_rank=".."}`."""
    lines: list[str] = []
    for entry in body["loads"]:
        rank = entry["dp_rank"]
        for key, value in entry.items():
            if key == "dp_rank":
                continue
            items = (
                [(f"sglang_{_PROMETHEUS_PREFIXES.get(key, key)}_{sub}", v) for sub, v in value.items()]
                if isinstance(value, dict)
                else [(f"sglang_{key}", value)]
            )
            for name, number in items:
                if isinstance(number, (int, float)) and not isinstance(number, bool):
                    lines += [f"# TYPE {name} gauge", f'{name}{{dp_rank="{rank}"}} {number}']
    return "\n".join(lines) + "\n"
