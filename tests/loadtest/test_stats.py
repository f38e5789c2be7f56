"""The statistics on recorded timelines whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from loadtest.records import LevelRun, RequestRecord
from loadtest.stats import (
    Slo,
    backend_share,
    distribution,
    level_stats,
    output_tokens,
    request_itls,
    request_tpot,
    tokens_per_chunk,
)
from tokencount import count_tokens


def streamed(
    start: float,
    chunks: list[tuple[float, str]],
    end: float,
    completion: int | None,
    prompt: int | None = 10,
    backend: str | None = None,
    expected: int = 0,
) -> RequestRecord:
    return RequestRecord(
        start=start,
        expected_output=expected or (completion or 0),
        headers_at=chunks[0][0] if chunks else None,
        end=end,
        status=200,
        chunk_times=[t for t, _ in chunks],
        chunk_texts=[text for _, text in chunks],
        prompt_tokens=prompt,
        completion_tokens=completion,
        backend=backend,
    )


def failed(kind: str) -> RequestRecord:
    return RequestRecord(start=0.0, expected_output=8, status=503, error_kind=kind)


def test_percentiles_use_linear_interpolation_like_numpy_and_bench_serving() -> None:
    d = distribution([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert d.p50 == pytest.approx(50.5)
    assert d.p90 == pytest.approx(90.1)
    assert d.p99 == pytest.approx(99.01)
    assert d.mean == pytest.approx(50.5)
    assert d.count == 100


def test_percentiles_of_a_small_sample_interpolate_between_points() -> None:
    d = distribution([0.010, 0.020, 0.040])
    assert d.p50 == pytest.approx(20.0)
    assert d.p90 == pytest.approx(36.0)  # 20 + 0.8 * (40 - 20)
    assert d.mean == pytest.approx(70 / 3)


def test_empty_sample_gives_none_not_zero() -> None:
    d = distribution([])
    assert (d.p50, d.p90, d.p99, d.mean, d.count) == (None, None, None, None, 0)


def test_ttft_tpot_e2e_of_a_plain_stream() -> None:
    # 10 tokens, one per chunk every 100 ms from t=1.1; [DONE] read at t=2.05.
    r = streamed(1.0, [(1.1 + 0.1 * i, "w") for i in range(10)], end=2.05, completion=10)
    assert r.ttft == pytest.approx(0.1)
    assert r.e2e == pytest.approx(1.05)
    # bench_serving: (latency - ttft) / (output_len - 1) = (1.05 - 0.1) / 9
    assert request_tpot(r) == pytest.approx(0.95 / 9)
    assert request_itls(r) == pytest.approx([0.1] * 9)


def test_speculative_chunks_count_itl_per_token() -> None:
    # One chunk of 1 token, then chunks of 3 and 2 tokens 300 ms apart: 6 tokens.
    r = streamed(0.0, [(0.1, "a"), (0.4, "b c d"), (0.7, "e f")], end=0.7, completion=6)
    assert tokens_per_chunk(r) == [1, 3, 2]
    assert request_itls(r) == pytest.approx([0.1, 0.1, 0.1, 0.15, 0.15])
    assert request_tpot(r) == pytest.approx(0.6 / 5)


def test_chunk_token_split_always_sums_to_usage() -> None:
    # The estimate says 1+1+1 but usage says 7: the 4 spare tokens go by weight, remainder first.
    r = streamed(0.0, [(0.1, "aaaa"), (0.2, "bbbbbbbbb"), (0.3, "c")], end=0.3, completion=7)
    counts = tokens_per_chunk(r)
    assert sum(counts) == 7
    assert counts == [2, 4, 1]  # weights 1, 3, 1 (count_tokens of a 9-letter word is 3)
    assert count_tokens("bbbbbbbbb") == 3


def test_one_chunk_per_token_is_exact_whatever_the_text() -> None:
    r = streamed(0.0, [(0.1, "hello world"), (0.2, "x")], end=0.2, completion=2)
    assert tokens_per_chunk(r) == [1, 1]


def test_tokens_come_from_usage_with_the_requested_length_as_fallback() -> None:
    with_usage = streamed(0.0, [(0.1, "a"), (0.2, "b")], end=0.2, completion=5, expected=2)
    without = streamed(0.0, [(0.1, "a"), (0.2, "b")], end=0.2, completion=None, expected=2)
    assert output_tokens(with_usage) == 5
    assert output_tokens(without) == 2


def test_non_streamed_request_has_ttft_equal_to_e2e_and_no_tpot() -> None:
    r = RequestRecord(start=0.0, expected_output=4, end=0.5, status=200, completion_tokens=4, prompt_tokens=3, streamed=False)
    assert r.ttft == pytest.approx(0.5)
    assert request_tpot(r) is None
    assert request_itls(r) == []


def test_backend_share_counts_successful_responses_only() -> None:
    records = [
        streamed(0, [(0.1, "a")], 0.1, 1, backend="eagle"),
        streamed(0, [(0.1, "a")], 0.1, 1, backend="plain"),
        streamed(0, [(0.1, "a")], 0.1, 1, backend="plain"),
        streamed(0, [(0.1, "a")], 0.1, 1, backend="plain"),
        failed("http_503"),
    ]
    assert backend_share(records) == {"eagle": 0.25, "plain": 0.75}
    assert backend_share([streamed(0, [(0.1, "a")], 0.1, 1)]) is None


def test_level_stats_from_a_recorded_timeline() -> None:
    # Two requests over a 2 s window: 10 and 20 output tokens, 10 prompt tokens each, one failure.
    a = streamed(0.0, [(0.2 + 0.1 * i, "t") for i in range(10)], end=1.1, completion=10, backend="eagle")
    b = streamed(0.5, [(1.0 + 0.05 * i, "t") for i in range(20)], end=2.0, completion=20, backend="plain")
    run = LevelRun(started=0.0, finished=2.0, records=[a, b, failed("http_503"), failed("timeout")])
    s = level_stats(run)
    assert (s.completed, s.failed) == (2, 2)
    assert s.errors == {"http_503": 1, "timeout": 1}
    assert s.duration_s == pytest.approx(2.0)
    assert s.request_s == pytest.approx(1.0)
    assert s.output_tok_s == pytest.approx(15.0)
    assert s.input_tok_s == pytest.approx(10.0)
    assert s.ttft.p50 == pytest.approx(350.0)  # 200 ms and 500 ms
    tpot_a, tpot_b = 0.9 / 9, 1.0 / 19
    assert s.tpot.mean == pytest.approx((tpot_a + tpot_b) / 2 * 1000)
    assert s.itl.count == 9 + 19
    assert s.e2e.p50 == pytest.approx(1300.0)  # 1.1 s and 1.5 s
    assert s.mean_concurrency == pytest.approx((1.1 + 1.5) / 2.0)
    assert s.backend_share == {"eagle": 0.5, "plain": 0.5}
    assert s.mean_chunk_interval_ms == pytest.approx(75.0)  # 100 ms and 50 ms between chunks


def test_a_level_where_everything_failed_reports_zero_throughput_and_no_latency() -> None:
    s = level_stats(LevelRun(0.0, 1.0, [failed("connect")] * 3))
    assert s.completed == 0
    assert s.output_tok_s == 0.0
    assert s.tpot.p50 is None and s.ttft.p50 is None
    assert s.errors == {"connect": 3}


def test_incomplete_stream_is_a_failure_not_a_short_response() -> None:
    r = streamed(0.0, [(0.1, "a")], end=0.1, completion=None)
    r.end = None
    r.error_kind = "incomplete"
    assert not r.ok
    assert r.ttft is None and request_tpot(r) is None


def test_chunk_token_split_keeps_one_token_per_chunk_without_overshooting() -> None:
    # Shares 0.33, 0.33, 3.33 round up to 1, 1, 3 = 5 > 4: the big chunk gives one back.
    r = streamed(0.0, [(0.1, "a"), (0.2, "b"), (0.3, "c" * 37)], end=0.3, completion=4)
    assert tokens_per_chunk(r) == [1, 1, 2]


def with_(record: RequestRecord, cached: int = 0, tier: str | None = None) -> RequestRecord:
    record.cached_tokens, record.tier = cached, tier
    return record


def test_cache_hit_rate_is_cached_over_prompt_tokens_of_the_successful_requests() -> None:
    a = with_(streamed(0.0, [(0.1, "t")], 0.1, 1, prompt=100), cached=80)
    b = with_(streamed(0.0, [(0.1, "t")], 0.1, 1, prompt=300), cached=0)  # a server that reports none reads 0
    traffic = level_stats(LevelRun(0.0, 1.0, [a, b, failed("http_503")])).traffic
    assert traffic is not None
    assert traffic.total_cached_tokens == 80 and traffic.cache_hit_rate == pytest.approx(80 / 400)
    assert traffic.goodput_request_s is None and traffic.tiers is None  # no SLO set, no tier asked for
    no_prompts = level_stats(LevelRun(0.0, 1.0, [streamed(0.0, [(0.1, "t")], 0.1, 1, prompt=None)])).traffic
    assert no_prompts is not None and no_prompts.cache_hit_rate is None


def test_goodput_counts_the_successful_requests_within_every_slo_per_second() -> None:
    # TTFT 100 / 300 / 100 ms; TPOT (e2e - ttft) / 9: 10 ms, 10 ms, 50 ms.
    fast = streamed(0.0, [(0.1 + 0.01 * i, "t") for i in range(10)], 0.19, 10)
    late = streamed(0.0, [(0.3 + 0.01 * i, "t") for i in range(10)], 0.39, 10)
    slow = streamed(0.0, [(0.1 + 0.05 * i, "t") for i in range(10)], 0.55, 10)
    run = LevelRun(0.0, 2.0, [fast, late, slow, failed("timeout")])
    assert level_stats(run, slo=Slo(ttft_ms=200)).traffic.goodput_request_s == pytest.approx(2 / 2.0)  # type: ignore[union-attr]
    assert level_stats(run, slo=Slo(tpot_ms=20)).traffic.goodput_request_s == pytest.approx(2 / 2.0)  # type: ignore[union-attr]
    assert level_stats(run, slo=Slo(200, 20)).traffic.goodput_request_s == pytest.approx(1 / 2.0)  # type: ignore[union-attr]
    one_token = streamed(0.0, [(0.1, "t")], 0.1, 1)
    assert Slo(tpot_ms=1).met(one_token) and not Slo(ttft_ms=50).met(one_token)  # no TPOT to miss
    assert Slo(100, 5).scaled(2.0) == Slo(200, 10) and not Slo().is_set


def test_each_service_tier_gets_its_own_numbers_when_the_workload_mixes_them() -> None:
    fast = with_(streamed(0.0, [(0.1 + 0.01 * i, "t") for i in range(10)], 0.19, 10), tier="priority")
    late = with_(streamed(0.0, [(0.3 + 0.01 * i, "t") for i in range(10)], 0.39, 10), tier="flex")
    untiered = streamed(0.0, [(0.1, "t")], 0.1, 1)
    lost = with_(failed("http_429"), tier="flex")
    traffic = level_stats(LevelRun(0.0, 1.0, [fast, late, untiered, lost]), slo=Slo(ttft_ms=200)).traffic
    assert traffic is not None and traffic.tiers is not None and list(traffic.tiers) == ["flex", "none", "priority"]
    flex, priority = traffic.tiers["flex"], traffic.tiers["priority"]
    assert (flex.requests, flex.completed, flex.goodput_request_s) == (2, 1, 0.0)
    assert (priority.requests, priority.completed, priority.goodput_request_s) == (1, 1, 1.0)
    assert priority.ttft_p50_ms == pytest.approx(100.0) and flex.e2e_p99_ms == pytest.approx(390.0)
    assert priority.tpot_p50_ms == pytest.approx(10.0)
