"""Operational routes: probes, Prometheus metrics, admin status, the node's /v1/loads, and SGLang info pass-through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from gateway.api.jobs import runtime_of
from gateway.api.redact import redact_server_info
from gateway.errors import OpenAIError
from gateway.pool.backends import Backend, Pool
from gateway.pool.node_load import SECTIONS, loads_prometheus, node_loads
from gateway.pool.prefix import BLOCK_BYTES
from gateway.runtime import Runtime

router = APIRouter()

_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _states(request: Request) -> dict[str, str]:
    runtime_of(request).pool.sync()
    return {b.name: b.health.value for b in runtime_of(request).pool}


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while at least one backend can serve."""
    rt = runtime_of(request)
    rt.pool.sync()
    if not any(b.available for b in rt.pool):
        raise OpenAIError(503, "no backend is ready", code="no_backend_available", type="server_error")
    return JSONResponse({"status": "ok", "backends": _states(request)})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """200 while the gateway accepts new requests: a backend can serve and it is not shutting down."""
    rt = runtime_of(request)
    if not rt.serving:
        reason = "the gateway is shutting down" if rt.draining else "no backend is ready"
        raise OpenAIError(503, reason, code="not_ready", type="server_error")
    return JSONResponse({"status": "ready", "backends": _states(request)})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return Response(runtime_of(request).metrics.exposition(), media_type=_PROMETHEUS_TEXT)


@router.get("/v1/loads")
async def v1_loads(request: Request, dp_rank: int | None = None, include: str | None = None, format: str | None = None) -> Response:
    """SGLang's load report for the whole node (one rank), for a cluster router such as SMG."""
    sections = {s.strip() for s in include.split(",")} if include else None
    if sections is not None and not sections <= SECTIONS:
        unknown = ", ".join(sorted(sections - SECTIONS))
        raise OpenAIError(400, f"invalid include sections: {unknown}; valid: {', '.join(sorted(SECTIONS))}", param="include")
    pool = runtime_of(request).pool
    pool.sync()  # with several workers: the health checker's latest engine figures
    body = node_loads(pool, sections, dp_rank)
    if format == "prometheus":
        return Response(loads_prometheus(body), media_type=_PROMETHEUS_TEXT)
    return JSONResponse(body)


@router.get("/admin/status")
async def admin_status(request: Request) -> dict[str, Any]:
    """The policy and what each backend looks like to the gateway right now."""
    rt = runtime_of(request)
    rt.catch_up()
    rt.pool.sync()
    return {
        "policy": rt.policy.describe(),
        "tiers": {
            "lane": rt.policy.tiers(),
            "flex_inflight_share": rt.settings.policy.tier_flex_inflight_share,
            "sglang_priority": rt.settings.policy.tier_sglang_priority,
        },
        "draining": rt.draining,
        "inflight": rt.pool.total_inflight,
        "limits": _limits(rt),
        "groups": _groups(rt.pool),
        "prefix": _prefix(rt),
        "backends": [
            {
                "name": b.name,
                "url": b.url,
                "speculative": b.speculative,
                "group": b.group,
                "state": b.health.value,
                "detail": b.health_detail,
                "served_model_name": b.served_model_name,
                "inflight": b.inflight_total,
                "requests_served": b.served_total,
                "kv": _kv(b),
            }
            for b in rt.pool
        ],
    }


def _kv(backend: Backend) -> dict[str, float | int | None]:
    """Its KV room as the policy weighs it: the capacity its engine reports (None before a report) and what
    its in-flight requests hold there (the prompt tokens they were sent to prefill, the output expected)."""
    load = backend.engine_load
    return {
        "capacity_tokens": load.kv_tokens if load is not None and load.kv_tokens else None,
        "held_prompt_tokens": backend.held_prompt_tokens_total,
        "expected_output_tokens": backend.expected_tokens_total,
    }


def _prefix(rt: Runtime) -> dict[str, Any]:
    """The prefix map: its size, and per backend the prompt tokens it reported cached and was predicted to hold."""
    table = rt.pool.board.prefix
    per_backend: dict[str, dict[str, float | None]] = {}
    sums = [0.0, 0.0, 0.0]
    for name in rt.pool.names:
        totals = rt.pool.prompt_totals(name)
        sums = [s + v for s, v in zip(sums, totals, strict=True)]
        per_backend[name] = _rates(*totals)
    return {
        "block_bytes": BLOCK_BYTES,
        "slots": table.slots,
        "occupied_slots": table.occupied(),
        "tokens_per_byte": rt.prefix_estimate.tokens_per_byte,
        "tokens_per_byte_spread": rt.prefix_estimate.spread,
        "trust": dict(zip(rt.pool.names, rt.prefix_estimate.trust, strict=True)),
        **_rates(*sums),
        "backends": per_backend,
    }


def _rates(prompt: float, cached: float, predicted: float) -> dict[str, float | None]:
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "predicted_tokens": predicted,
        "hit_rate": cached / prompt if prompt else None,
        "predicted_hit_rate": predicted / prompt if prompt else None,
    }


def _limits(rt: Runtime) -> dict[str, Any]:
    """The descriptor budget, the open client connections and what each client may hold."""
    limits = rt.settings.limits
    return {
        **rt.budget.describe(limits.max_inflight),
        "client_connections": len(rt.client_connections),
        "client_header_timeout_seconds": limits.client_header_timeout_seconds,
        "client_body_timeout_seconds": limits.client_body_timeout_seconds,
        "max_connections_per_client": limits.max_connections_per_client,
    }


def _groups(pool: Pool) -> dict[str, dict[str, Any]]:
    """Each GPU group: its backends and their total in-flight count."""
    groups: dict[str, dict[str, Any]] = {}
    for b in pool:
        entry = groups.setdefault(b.group, {"backends": [], "inflight": 0})
        entry["backends"].append(b.name)
        entry["inflight"] += b.inflight_total
    return groups


async def _pass_through(request: Request, path: str, redact: Callable[[bytes], bytes] | None = None) -> Response:
    """Relay an SGLang info GET from the speculative backend (else any ready one).

    SGLang's benchmark reads the accept length from /server_info to count inter-token latency
    per token rather than per chunk, which is right for either backend behind the gateway.
    """
    rt = runtime_of(request)
    rt.pool.sync()
    candidates = sorted((b for b in rt.pool if b.available), key=lambda b: not b.speculative)
    if not candidates:
        raise OpenAIError(503, "no backend is ready", code="no_backend_available", type="server_error")
    backend = candidates[0]
    try:
        status, body, content_type = await rt.upstreams[backend.name].get(path, rt.settings.health.ready_timeout * 5)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise OpenAIError(502, f"backend {backend.name} did not answer {path}", code="upstream_unreachable", type="server_error") from exc
    if redact is not None:
        body = redact(body)
    return Response(body, status_code=status, media_type=content_type, headers={"x-specgate-backend": backend.name})


@router.get("/server_info")
@router.get("/get_server_info", include_in_schema=False)  # SGLang's deprecated alias, still used by its clients
async def server_info(request: Request) -> Response:
    """SGLang's /server_info of the speculative backend, without the secrets SGLang puts in it."""
    return await _pass_through(request, "/server_info", redact_server_info)


@router.get("/model_info")
@router.get("/get_model_info", include_in_schema=False)  # used by sglang's RuntimeEndpoint
async def model_info(request: Request) -> Response:
    """SGLang's /model_info."""
    return await _pass_through(request, "/model_info")
