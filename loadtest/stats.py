"""Statistics of one target at one load level, with SGLang bench_serving's definitions.

- TTFT: send to the first SSE event carrying output text (whole response when not streamed).
- E2E: send to the end of the response (the `[DONE]` line for a stream).
- TPOT (excl. 1st token): `(e2e - ttft) / (output_tokens - 1)` per request, for requests with
  more than one output token; output tokens from `usage.completion_tokens`.
- ITL: per token, as bench_serving does when the accept length is known: the gap between two
  consecutive text chunks, divided by the k tokens the later chunk carries, counted k times. So a
  speculative step that delivers 3 tokens in one chunk 30 ms after the last one gives three 10 ms
  ITLs, and ITL stays comparable between EAGLE and plain servers. Per-chunk token counts come from
  splitting `usage.completion_tokens` across chunks (see `tokens_per_chunk`).
- Percentiles: numpy's linear interpolation (`np.percentile`), as bench_serving.
- Throughput: tokens of successful requests / the level's wall-clock duration.
- Cache hit rate: cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`) / prompt
  tokens, over the successful requests.
- Goodput (bench_serving's `--goodput`): successful requests that meet every SLO set (TTFT, TPOT
  of a request with more than one output token), per second of the level; None without an SLO.
Not streamed: TTFT = E2E as bench_serving, and TPOT/ITL are not measured (None), not 0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from loadtest.records import LevelRun, RequestRecord
from tokencount import count_tokens

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class Distribution:
    """p50/p90/p99/mean of a sample, in milliseconds; None when the sample is empty.

    `count` is the sample size, None for a distribution read back from results.json (which does
    not store it).
    """

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int | None = None


def distribution(seconds: Sequence[float]) -> Distribution:
    """Summarise a sample of durations given in seconds as milliseconds."""
    if not seconds:
        return Distribution(None, None, None, None, 0)
    values = np.asarray(seconds, dtype=float) * 1000.0
    p50, p90, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
    return Distribution(p50, p90, p99, float(values.mean()), len(values))


def output_tokens(record: RequestRecord) -> int:
    """Output tokens of a finished request: `usage.completion_tokens`, else the tokens asked for.

    The fallback is bench_serving's: with `ignore_eos` the server generates exactly
    `max_tokens`, so a server that omits usage is still counted correctly.
    """
    if record.completion_tokens is not None:
        return record.completion_tokens
    return record.expected_output


def tokens_per_chunk(
    record: RequestRecord, counter: Callable[[str], int] = count_tokens
) -> list[int]:
    """How many output tokens each text chunk carried, summing to the request's output tokens.

    One chunk per token (plain decode) is recognised exactly. Otherwise the usage total is split
    across chunks in proportion to each chunk's estimated token count, at least one token per
    chunk, largest remainders first, so totals always match `usage`.
    """
    n = len(record.chunk_texts)
    total = output_tokens(record)
    if n == 0:
        return []
    if total <= n:
        return [1] * n
    weights = [max(counter(text), 1) for text in record.chunk_texts]
    scale = total / sum(weights)
    shares = [w * scale for w in weights]
    counts = [max(1, int(s)) for s in shares]
    by_remainder = sorted(range(n), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    missing = total - sum(counts)
    for i in by_remainder[:max(missing, 0)]:
        counts[i] += 1
    # Raising tiny shares to one token can overshoot; take the excess from the biggest chunks.
    while sum(counts) > total:
        counts[counts.index(max(counts))] -= 1
    return counts


def request_tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first, in seconds (None if not measurable)."""
    ttft, e2e, out = record.ttft, record.e2e, output_tokens(record)
    if not record.streamed or ttft is None or e2e is None or out <= 1:
        return None
    return (e2e - ttft) / (out - 1)


def request_itls(record: RequestRecord, counter: Callable[[str], int] = count_tokens) -> list[float]:
    """Per-token inter-token latencies of one request, in seconds (see the module docstring)."""
    if not record.ok or not record.streamed or len(record.chunk_times) < 2:
        return []
    counts = tokens_per_chunk(record, counter)
    itls: list[float] = []
    for i in range(1, len(record.chunk_times)):
        gap = record.chunk_times[i] - record.chunk_times[i - 1]
        k = counts[i]
        itls.extend([gap / k] * k)
    return itls


def chunk_interval(record: RequestRecord) -> float | None:
    """Mean seconds between a request's text chunks (a decode step's duration as the client saw it)."""
    if not record.ok or len(record.chunk_times) < 2:
        return None
    return (record.chunk_times[-1] - record.chunk_times[0]) / (len(record.chunk_times) - 1)


def backend_share(records: Sequence[RequestRecord]) -> dict[str, float] | None:
    """Fraction of successful requests served by each backend (`x-specgate-backend`), or None.

    None when no response carried the header (a server that is not specgate).
    """
    names = [r.backend for r in records if r.ok and r.backend]
    if not names:
        return None
    counts = Counter(names)
    return {name: counts[name] / len(names) for name in sorted(counts)}


@dataclass(frozen=True)
class Slo:
    """The service-level objectives a request must meet to count toward goodput (None: not set), in ms."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @property
    def is_set(self) -> bool:
        """Whether any objective is set."""
        return self.ttft_ms is not None or self.tpot_ms is not None

    def scaled(self, factor: float) -> Slo:
        """The objectives on a clock `factor` times slower (the envelope's time scale)."""
        return Slo(*(None if ms is None else ms * factor for ms in (self.ttft_ms, self.tpot_ms)))

    def met(self, record: RequestRecord) -> bool:
        """Whether a request succeeded within every objective (a one-token answer has no TPOT to miss)."""
        ttft, tpot = record.ttft, request_tpot(record)
        if not record.ok or (self.ttft_ms is not None and (ttft is None or ttft * 1000.0 > self.ttft_ms)):
            return False
        return self.tpot_ms is None or tpot is None or tpot * 1000.0 <= self.tpot_ms


@dataclass(frozen=True)
class TierStats:
    """One service tier's requests at a level (latencies in ms, None where not measured)."""

    requests: int
    completed: int
    goodput_request_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None


@dataclass(frozen=True)
class TrafficStats:
    """What the users' traffic got: prompt cache reuse, goodput under the SLOs, each service tier's numbers.

    `cache_hit_rate` is None when no successful request reported prompt tokens; `tiers` None when
    the workload sets no tier (requests without one are tier `none` in a mix).
    """

    total_cached_tokens: int
    cache_hit_rate: float | None
    goodput_request_s: float | None
    tiers: Mapping[str, TierStats] | None = None


NO_TIER = "none"


def traffic_stats(run: LevelRun, slo: Slo) -> TrafficStats:
    """Cache reuse, goodput and the tiers' numbers of one target at one level."""
    ok = [r for r in run.records if r.ok]
    cached = sum(r.cached_tokens for r in ok)
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    tiers: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in run.records:
        tiers[record.tier or NO_TIER].append(record)
    return TrafficStats(
        total_cached_tokens=cached,
        cache_hit_rate=cached / prompt if prompt else None,
        goodput_request_s=_goodput(run.records, slo, run.duration),
        tiers={name: _tier(tiers[name], slo, run.duration) for name in sorted(tiers)} if set(tiers) != {NO_TIER} else None,
    )


def _goodput(records: Sequence[RequestRecord], slo: Slo, duration: float) -> float | None:
    return sum(1 for r in records if slo.met(r)) / duration if slo.is_set else None


def _tier(records: Sequence[RequestRecord], slo: Slo, duration: float) -> TierStats:
    ok = [r for r in records if r.ok]
    ttft = distribution([t for r in ok if (t := r.ttft) is not None])
    e2e = distribution([t for r in ok if (t := r.e2e) is not None])
    tpot = distribution([t for r in ok if (t := request_tpot(r)) is not None])
    return TierStats(len(records), len(ok), _goodput(records, slo, duration), ttft.p50, ttft.p99, tpot.p50, e2e.p50, e2e.p99)


@dataclass(frozen=True)
class LevelStats:
    """Everything reported for one target at one load level."""

    completed: int
    failed: int
    errors: Mapping[str, int]
    duration_s: float
    request_s: float
    output_tok_s: float
    input_tok_s: float
    total_output_tokens: int
    total_input_tokens: int
    mean_concurrency: float
    usage_missing: int
    mean_chunk_interval_ms: float | None
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    backend_share: Mapping[str, float] | None
    traffic: TrafficStats | None = None  # None: read from a file written before it was recorded


def level_stats(run: LevelRun, counter: Callable[[str], int] = count_tokens, slo: Slo = Slo()) -> LevelStats:
    """Compute every reported number for one target at one level from its recorded requests."""
    ok = [r for r in run.records if r.ok]
    errors = Counter(r.error_kind or "unknown" for r in run.records if not r.ok)
    duration = run.duration
    out_tokens = sum(output_tokens(r) for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    ttfts = [t for r in ok if (t := r.ttft) is not None]
    tpots = [t for r in ok if (t := request_tpot(r)) is not None]
    e2es = [t for r in ok if (t := r.e2e) is not None]
    itls = [itl for r in ok for itl in request_itls(r, counter)]
    intervals = [i for r in ok if (i := chunk_interval(r)) is not None]
    return LevelStats(
        completed=len(ok),
        failed=len(run.records) - len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=duration,
        request_s=len(ok) / duration,
        output_tok_s=out_tokens / duration,
        input_tok_s=in_tokens / duration,
        total_output_tokens=out_tokens,
        total_input_tokens=in_tokens,
        mean_concurrency=sum(e2es) / duration,
        usage_missing=sum(1 for r in ok if r.completion_tokens is None),
        mean_chunk_interval_ms=1000.0 * sum(intervals) / len(intervals) if intervals else None,
        ttft=distribution(ttfts),
        tpot=distribution(tpots),
        itl=distribution(itls),
        e2e=distribution(e2es),
        backend_share=backend_share(run.records),
        traffic=traffic_stats(run, slo),
    )
