"""Fuzzing at CI size: schemathesis cases from /openapi.json, then malformed HTTP on raw sockets.

`python -m benchmarks.fuzz` runs the same code at full size (1,000 schemathesis cases); see
benchmarks/fuzz.py for how each answer is judged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fuzz import (
    FuzzResult,
    fuzz_raw,
    fuzz_schema,
    fuzz_target,
    settle_inflight,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

CASES = 150
MUTATIONS = 100


def test_fuzzed_requests_get_no_gateway_5xx_no_hang_and_openai_errors(tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    result = FuzzResult()
    with fuzz_target(tmp_path) as (url, model):
        fuzz_schema(url, model, CASES, result)
        fuzz_raw(url, model, MUTATIONS, result)
        settle_inflight(url, result)
    record_property("schemathesis_cases", result.schema_cases)
    record_property("raw_cases", result.raw_cases)
    record_property("gateway_5xx", len(result.gateway_5xx))
    record_property("hangs", len(result.hangs))
    record_property("errors_not_openai_shaped", len(result.bad_errors))
    assert result.schema_cases == CASES
    assert result.statuses[200] > 0 and result.statuses[400] > 0  # valid requests got through, invalid ones were refused
    assert not result.problems(), result.problems()
