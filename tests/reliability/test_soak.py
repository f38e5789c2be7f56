"""The CI soak: 5,000 requests at concurrency 256 through `specgate serve` and its simulated backends.

`python -m benchmarks.soak --requests 100000 --baseline 600s` is the full soak. A 5,000-request run
lasts under a minute, so its memory window is proportionate: the baseline is taken once 20% of the
requests have completed (warm-up: connection pools and the allocator still growing), and compared
with the end of the load.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import SoakSettings, run_soak

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]


async def test_soak_loses_nothing_and_keeps_memory_and_descriptors_flat(tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    result = await run_soak(SoakSettings(requests=5000, concurrency=256, baseline="20%"), tmp_path)
    assert result.baseline is not None and result.final is not None
    record_property("requests", result.settings.requests)
    record_property("lost", result.lost)
    record_property("rss_growth_percent", round(100 * result.rss_growth, 2))
    record_property("fds_baseline_end_idle", f"{result.baseline.fds}/{result.final.fds}/{result.idle_fds}")
    record_property("requests_per_second", round(result.settings.requests / result.seconds, 1))
    assert result.completed == result.settings.requests
    assert not result.failures(), result.failures()
