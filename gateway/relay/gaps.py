"""Inter-token gaps of one stream, counted into a Prometheus histogram's buckets and added once per stream."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from prometheus_client import Histogram

try:
    from gateway.relay._sse import GapCounts  # the relay's hot path in C
except ImportError:  # built without a C compiler
    GapCounts = None


class _GapCounts:
    """gateway.relay._sse.GapCounts in Python, for a build without the C extension."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self._counts = [0] * len(bounds)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def take(self) -> tuple[list[int], float]:
        taken = self._counts, self._sum
        self._counts, self._sum = [0] * len(self._bounds), 0.0
        return taken


class GapBuffer:
    """One stream's inter-token gaps for a histogram series, added to it in one go when the stream ends.

    `observe(seconds)` counts a gap in the first bucket whose bound is at least `seconds`, as
    Histogram.observe does, but as a C call (`_sse.GapCounts`, which the C relay calls without a
    Python frame) or, without the C extension, a bisect in Python; `flush` adds the counts once per
    stream through the series' own bucket values (prometheus_client keeps them per bucket, not
    cumulative). An observe into the histogram itself per chunk was a large share of the relay's
    own work (docs/benchmarks/relay-cost.md).
    """

    __slots__ = ("_series", "_gaps", "observe")

    def __init__(self, series: Histogram) -> None:
        self._series = series
        bounds: list[float] = list(series._upper_bounds)  # type: ignore[attr-defined]
        self._gaps = _GapCounts(bounds) if GapCounts is None else GapCounts(bounds)
        self.observe: Callable[[float], None] = self._gaps.observe

    def flush(self) -> None:
        """Add the gaps counted so far to the series."""
        counts, total = self._gaps.take()
        if not any(counts):
            return
        buckets = self._series._buckets  # type: ignore[attr-defined]
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)
        self._series._sum.inc(total)  # type: ignore[attr-defined]
