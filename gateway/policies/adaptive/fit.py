"""Online estimate of one backend's time per output token as a function of its in-flight count.

Each response (or stretch of a streaming one) gives one point: the mean in-flight count while it
decoded, and decode seconds per token. Points are kept per band of loads (a quarter octave wide): a
band's level is the weighted median of its latest responses (older ones count less, by `half_life`),
so another request's long prefill landing in a few responses does not move it; the levels are made
non-decreasing in load (a larger batch never decodes a token faster). The curve runs straight between
measured bands and beyond them at the slope of the measured stretch nearest (at least zero); with one
band measured, at a weak prior slope (with `far_prior`, also past twice the loads measured, where
that is gentler). So a bent step table is followed where it is measured, and a new load is news
about the curve there, never a changed backend. A backend that changed (a restart with other
settings, a drop in acceptance) shows as responses in well-measured bands at loads apart off the same
way: every band then moves to the new level and keeps little weight, so the curve re-learns within
tens of responses. Responses off at one load only move the curve near it: the requests decoding
together share their steps' prefills, so their responses are off together whatever the backend.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

BANDS_PER_OCTAVE = 4
BAND_MEMORY = 32  # responses a band keeps (its latest)
SHRINK = 2.0  # responses' worth of weight the line through neighbouring bands has in each band's level
SHIFT_MEMORY = 9  # residuals whose median sizes a detected change
NEW_REGIME = 20  # the latest responses when a change is detected, taken to show it already (not moved)
SPREAD = 2.0  # a slope, or a changed backend, is read only across points at least this factor apart in load


@dataclass(frozen=True)
class EstimatorConfig:
    """Tuning of the fit; every default is profile-free (no model, GPU or draft constants)."""

    half_life: float = 200.0  # a band's responses until its old evidence counts half
    prior_slope_ratio: float = 0.1  # with one band measured: slope per request relative to the lone-request TPOT
    # Past `SPREAD` times the loads measured, the prior's slope where it is gentler than the measured one:
    # for plain decode, whose curve is corrected as soon as a load is sent there (see `_curve`).
    far_prior: bool = False
    mature: int = 3  # responses before a band is a point of the curve (while some band is)
    huber_k: float = 2.0  # the change detector clips residuals at 1.5 * k running scales
    scale_floor: float = 0.01  # relative noise floor
    scale_cap: float = 0.5
    scale_rate: float = 0.05  # EWMA rate of the residual scale
    shift_rate: float = 0.1  # EWMA rate of the change detector (about the last 10 responses)
    shift_sign: float = 0.85  # |mean sign of residuals| that signals a consistent shift ...
    shift_size: float = 0.15  # ... when the mean relative residual is also at least this
    relearn_keep: float = 0.05  # share of a band's weight kept when the backend changed
    full_weight_tokens: int = 64  # responses with fewer decode tokens count proportionally less


class Curve(Protocol):
    """Seconds per output token against the in-flight count."""

    def at(self, n: float) -> float: ...

    def scaled(self, factor: float) -> Curve: ...

    @property
    def reach(self) -> float:
        """The largest in-flight count it was measured at (beyond it, an extrapolation)."""
        ...

    @property
    def floor(self) -> float:
        """The smallest in-flight count it was measured at (below it, an extrapolation)."""
        ...


@dataclass(frozen=True)
class TpotLine:
    """A straight curve, `alpha + beta * n` (seconds): the shape of calibration.md's step model."""

    alpha: float
    beta: float

    def at(self, n: float) -> float:
        return self.alpha + self.beta * n

    def scaled(self, factor: float) -> TpotLine:
        return TpotLine(self.alpha * factor, self.beta * factor)

    @property
    def reach(self) -> float:
        return math.inf  # a line given, not measured: it holds everywhere

    @property
    def floor(self) -> float:
        return 0.0


def _load(point: tuple[float, float]) -> float:
    return point[0]


@dataclass(frozen=True)
class TpotCurve:
    """Straight between measured points (n increasing), beyond them at `low_slope` and `high_slope`, and
    past `SPREAD` times the last point's load at `far_slope` (None: `high_slope` all the way)."""

    points: tuple[tuple[float, float], ...]
    low_slope: float
    high_slope: float
    far_slope: float | None = None
    # The points' loads alone: a routing decision reads a curve dozens of times, and a bisection with a
    # key function calls back into Python at every step.
    _loads: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_loads", tuple(n for n, _ in self.points))

    def at(self, n: float) -> float:
        points = self.points
        first_n, first_y = points[0]
        if n <= first_n:
            return max(first_y - self.low_slope * (first_n - n), 0.5 * first_y)
        last_n, last_y = points[-1]
        if n >= last_n:
            if self.far_slope is None or n <= SPREAD * last_n:
                return last_y + self.high_slope * (n - last_n)
            return last_y + self.high_slope * (SPREAD - 1.0) * last_n + self.far_slope * (n - SPREAD * last_n)
        i = bisect.bisect_left(self._loads, n)  # points[i - 1] < n <= points[i], 0 < i < len
        (n0, y0), (n1, y1) = points[i - 1], points[i]
        return y0 + (y1 - y0) * (n - n0) / (n1 - n0) if n1 > n0 else y1

    def scaled(self, factor: float) -> TpotCurve:
        far = None if self.far_slope is None else self.far_slope * factor
        return TpotCurve(tuple((n, y * factor) for n, y in self.points), self.low_slope * factor, self.high_slope * factor, far)

    @property
    def reach(self) -> float:
        return self.points[-1][0]

    @property
    def floor(self) -> float:
        return self.points[0][0]


@dataclass
class _Band:
    """One band's latest responses, `(load, TPOT, weight, the estimator's observation count then)`, newest last."""

    points: deque[tuple[float, float, float, int]] = field(default_factory=lambda: deque(maxlen=BAND_MEMORY))
    count: int = 0  # responses ever, undecayed

    def weighted(self, decay: float) -> list[tuple[float, float, float]]:
        """The points with their weights aged: a response counts `decay` less for each later one."""
        age = len(self.points)
        out = []
        for n, y, w, _ in self.points:
            age -= 1
            out.append((n, y, w * decay**age))
        return out


def _median(points: list[tuple[float, float, float]], field: int, total: float) -> float:
    half, run = total / 2.0, 0.0
    ordered = sorted(points, key=lambda p: p[field])
    for p in ordered:
        run += p[2]
        if run >= half:
            return p[field]
    return ordered[-1][field]  # unreachable: the weights sum to `total`


def band_of(n: float) -> int:
    """The band a load falls in: a quarter octave from 1 up (everything below 1 is band 0)."""
    return int(BANDS_PER_OCTAVE * math.log2(n)) if n > 1.0 else 0


def merged_curve(estimators: Iterable[TpotEstimator], prior_slope_ratio: float, *, far_prior: bool = False) -> TpotCurve | None:
    """One curve from several backends' bands (identical servers: their evidence adds up): per band,
    the weighted mean of their levels."""
    sums: dict[int, list[float]] = {}  # band -> [weight, weight * load, weight * TPOT, responses]
    for estimator in estimators:
        for index, (n, y, w) in estimator.levels().items():
            acc = sums.setdefault(index, [0.0, 0.0, 0.0, 0.0])
            acc[0] += w
            acc[1] += w * n
            acc[2] += w * y
            acc[3] += estimator.bands[index].count
    levels = {index: (wn / w, wy / w, w) for index, (w, wn, wy, _) in sums.items()}
    counts = {index: int(acc[3]) for index, acc in sums.items()}
    return _curve(levels, counts, EstimatorConfig(prior_slope_ratio=prior_slope_ratio, far_prior=far_prior))


def _curve(levels: dict[int, tuple[float, float, float]], counts: dict[int, int], config: EstimatorConfig) -> TpotCurve | None:
    """The curve through bands' levels `(load, TPOT, weight)`."""
    if not levels:
        return None
    mature = [level for index, level in levels.items() if counts[index] >= config.mature] or list(levels.values())
    lines = _local_lines(mature)
    # Each band's level pulled towards the line through the bands around it by `SHRINK` responses'
    # worth: a band of a few responses, which one unlucky draw can move far, leans on its neighbours;
    # a well-measured band keeps its own level, and a bent curve stays bent (the line is local).
    shrunk = sorted((n, (w * y + SHRINK * at) / (w + SHRINK), w + SHRINK) for (n, y, w), (at, _) in zip(mature, lines, strict=True))
    points = _non_decreasing(shrunk)
    low, high = points[0], points[-1]
    if high[0] < SPREAD * max(low[0], 1.0):
        # Too little spread in load for a slope of its own (neighbouring bands a few requests apart
        # would turn noise into a steep line): the prior's, through the highest point.
        n, y = high
        slope = config.prior_slope_ratio * y / (1.0 + config.prior_slope_ratio * n)
        return TpotCurve(points, slope, slope)
    near_top = [p for p in points if p[0] >= high[0] / 4.0]
    if near_top[-1][0] < SPREAD * max(near_top[0][0], 1.0):
        near_top = list(points)
    near_bottom = [p for p in points if p[0] <= 4.0 * max(low[0], 1.0)]
    if near_bottom[-1][0] < SPREAD * max(low[0], 1.0):
        near_bottom = list(points)
    high_slope = _slope(near_top)
    if not config.far_prior:
        return TpotCurve(points, _slope(near_bottom), high_slope)
    # A slope read off a stretch of light loads is no evidence far beyond them (a few responses slowed by
    # other requests' prefills steepen it), and plain decode priced too dear there is never sent the
    # load that would correct it: the group stays on EAGLE however high the load climbs.
    n, y = high
    prior = config.prior_slope_ratio * y / (1.0 + config.prior_slope_ratio * n)
    return TpotCurve(points, _slope(near_bottom), high_slope, min(high_slope, prior))


def _non_decreasing(levels: list[tuple[float, float, float]]) -> tuple[tuple[float, float], ...]:
    """Levels `(load, TPOT, weight)` in increasing load as points `(load, TPOT)` made non-decreasing in
    TPOT (weighted isotonic regression: adjacent levels that fall are pooled to their weighted mean). A
    batch one request larger never decodes a token faster, so a fall is noise (a band whose responses
    were a burst's short answers, decoded while the rest of it prefilled, reads slow; the band above,
    fast), and a curve that fell sent every request to the busier of two servers alike."""
    blocks: list[tuple[float, float, int]] = []  # (weight, weight * TPOT, levels pooled)
    for _, y, w in levels:
        block = (w, w * y, 1)
        while blocks and blocks[-1][1] / blocks[-1][0] > block[1] / block[0]:
            w0, wy0, k0 = blocks.pop()
            block = (w0 + block[0], wy0 + block[1], k0 + block[2])
        blocks.append(block)
    pooled = [wy / w for w, wy, k in blocks for _ in range(k)]
    return tuple((n, y) for (n, _, _), y in zip(levels, pooled, strict=True))


def _local_lines(levels: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """Per level `(load, TPOT, weight)`: the weighted line through the levels around it (within a factor
    `SPREAD` in load), as (its value at that load, its slope); the level itself and no slope with fewer
    than three around."""
    out = []
    for n, y, _ in levels:
        near = [p for p in levels if n / SPREAD <= p[0] <= n * SPREAD]
        if len(near) < 3:
            out.append((y, 0.0))
            continue
        total = sum(pw for _, _, pw in near)
        n_mean = sum(pn * pw for pn, _, pw in near) / total
        y_mean = sum(py * pw for _, py, pw in near) / total
        var = sum(pw * (pn - n_mean) ** 2 for pn, _, pw in near)
        slope = sum(pw * (pn - n_mean) * (py - y_mean) for pn, py, pw in near) / var if var > 0.0 else 0.0
        out.append((y_mean + slope * (n - n_mean), slope))
    return out


def _slope(points: list[tuple[float, float]] | tuple[tuple[float, float], ...]) -> float:
    """The least-squares slope through `points` (at least zero; zero without spread in n)."""
    if len(points) < 2:
        return 0.0
    n_mean = sum(n for n, _ in points) / len(points)
    y_mean = sum(y for _, y in points) / len(points)
    var = sum((n - n_mean) ** 2 for n, _ in points)
    cov = sum((n - n_mean) * (y - y_mean) for n, y in points)
    return max(cov / var, 0.0) if var > 0.0 else 0.0


class TpotEstimator:
    """Robust, forgetting curve of TPOT(n) for one backend; feed it with `observe`, read `predict` or `curve`."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self.decay = 0.5 ** (1.0 / self.config.half_life)  # a response's weight, per later one in its band
        self.bands: dict[int, _Band] = {}
        self.observations = 0  # since creation
        self.relearns = 0
        self.evidence = 0.0  # undecayed sum of observation weights since the last relearn or reset
        self._scale = 0.1
        self._shift_sign = 0.0
        self._shift_mean = 0.0
        self._residuals: deque[tuple[float, float]] = deque(maxlen=SHIFT_MEMORY)  # the latest (residual, load), against mature bands
        self._since_relearn = 0
        self._cached: TpotCurve | None = None
        self.version = 0  # moves whenever the curve may have changed
        self._shape: TpotCurve | None = None  # the last curve computed, whose slopes detrend the bands
        self._levels: dict[int, tuple[float, float, float]] = {}  # per band, until it changes

    @property
    def fitted(self) -> bool:
        return bool(self.bands)

    @property
    def curve(self) -> TpotCurve | None:
        """The current curve, or None before any observation."""
        if self._cached is None:
            counts = {index: band.count for index, band in self.bands.items()}
            first = self._shape is None
            self._cached = _curve(self._band_levels(), counts, self.config)
            self._shape = self._cached
            if first and self._cached is not None:  # the bands' levels read again along the first curve's slopes
                self._levels.clear()
                self._cached = self._shape = _curve(self._band_levels(), counts, self.config)
        return self._cached

    def levels(self) -> dict[int, tuple[float, float, float]]:
        """Per band its level: (median load, median TPOT, weight), each band's recomputed only when it
        changed. A band's responses lie across its width, on a curve that rises there: their TPOTs are
        moved along the last curve's slope across the band to its median load before the median is taken."""
        if self._shape is None and self.bands:
            _ = self.curve  # the first curve, whose slopes the levels follow
        return self._band_levels()

    def _band_levels(self) -> dict[int, tuple[float, float, float]]:
        for index, band in self.bands.items():
            if index not in self._levels:
                self._levels[index] = self._band_level(band)
        return self._levels

    def predict(self, n: float) -> float:
        """Predicted seconds per output token with n requests in flight (NaN before the first observation)."""
        curve = self.curve
        return curve.at(n) if curve is not None else math.nan

    def observe(self, n: float, tpot: float, tokens: int | None = None) -> None:
        """Add one response: `n` mean in-flight while it decoded, `tpot` its seconds per token.

        `tokens` (the decode tokens behind `tpot`) scales its weight: a short response's TPOT is a
        handful of steps and, under speculation, of random acceptance draws.
        """
        if not (tpot > 0.0 and math.isfinite(tpot) and n >= 0.0 and math.isfinite(n)):
            return
        cfg = self.config
        weight = 1.0 if tokens is None else min(1.0, max(tokens, 1) / cfg.full_weight_tokens)
        self.observations += 1
        index = band_of(n)
        band = self.bands.setdefault(index, _Band())
        if band.count >= cfg.mature and self._detect_shift(index, n, tpot):
            band = self.bands[index]
        band.points.append((n, tpot, weight, self.observations))
        band.count += 1
        self.evidence += weight
        self._levels.pop(index, None)
        self._cached = None
        self.version += 1

    def forget(self, keep: float) -> None:
        """Scale all evidence down to `keep` (0 forgets all but a trace); the curve's shape stays the starting point."""
        keep = max(keep, 1e-6)  # a trace of weight keeps each band's level until new responses outweigh it
        for band in self.bands.values():
            band.points = deque(((n, y, w * keep, i) for n, y, w, i in band.points), maxlen=BAND_MEMORY)
        self.evidence *= keep
        self._shift_sign = self._shift_mean = 0.0
        self._residuals.clear()
        self._since_relearn = 0
        self._levels.clear()
        self._cached = None
        self.version += 1

    def describe(self) -> dict[str, Any]:
        """The measured points and fit health, for /admin/status."""
        curve = self.curve
        return {
            "points": [[round(n, 2), round(y, 6)] for n, y in curve.points] if curve else [],
            "slope_beyond_seconds_per_request": curve.high_slope if curve else None,
            "slope_far_beyond_seconds_per_request": curve.far_slope if curve else None,
            "observations": self.observations,
            "effective_observations": round(sum(w for b in self.bands.values() for _, _, w in b.weighted(self.decay)), 2),
            "residual_scale": round(self._scale, 4),
            "relearns": self.relearns,
        }

    def _band_level(self, band: _Band) -> tuple[float, float, float]:
        points = band.weighted(self.decay)
        total = sum(w for _, _, w in points)
        n = _median(points, 0, total)
        shape = self._shape
        if shape is not None:
            lo, hi = min(p[0] for p in points), max(p[0] for p in points)
            slope = (shape.at(hi) - shape.at(lo)) / (hi - lo) if hi > lo else 0.0
            points = [(pn, py - slope * (pn - n), pw) for pn, py, pw in points]
        return n, _median(points, 1, total), total

    def _detect_shift(self, index: int, n: float, tpot: float) -> bool:
        """Run the change detector on a response at load `n` in a well-measured band; True when it re-learned.

        Residuals are clipped to a few running scales, so outliers cannot fake a shift while a real one
        (every response off by the same margin) still gets through. A changed backend is off at every
        load, so the latest residuals must span loads `SPREAD` apart: responses off at one load only
        (a stretch of prefill-heavy steps, which every request decoding then shares) are news about the
        curve there, which that band's median follows, not about the others."""
        cfg = self.config
        r = tpot / self.levels()[index][1] - 1.0
        self._residuals.append((r, max(n, 1.0)))
        self._since_relearn += 1
        base = cfg.huber_k * self._scale
        clipped = max(-1.5 * base, min(1.5 * base, r))
        self._shift_sign += cfg.shift_rate * ((1.0 if r > 0 else -1.0 if r < 0 else 0.0) - self._shift_sign)
        self._shift_mean += cfg.shift_rate * (clipped - self._shift_mean)
        self._scale += cfg.scale_rate * (min(abs(r), base) * 1.2533 - self._scale)
        self._scale = min(max(self._scale, cfg.scale_floor), cfg.scale_cap)
        loads = [load for _, load in self._residuals]
        if not (
            self._since_relearn * cfg.shift_rate >= 1.0
            and abs(self._shift_sign) >= cfg.shift_sign
            and abs(self._shift_mean) >= cfg.shift_size
            and max(loads) >= SPREAD * min(loads)
        ):
            return False
        # Most recent responses sit on one side of measured bands by a material margin: the backend
        # changed. Every band moves by that margin (the median of the latest residuals: unclipped, so a
        # large change is taken whole) and keeps a sliver of its weight.
        shift = 1.0 + sorted(r for r, _ in self._residuals)[len(self._residuals) // 2]
        changed = self.observations - NEW_REGIME  # responses since then already show the change
        for band in self.bands.values():
            band.points = deque(
                ((n, y * shift if i < changed else y, w, i) for n, y, w, i in band.points), maxlen=BAND_MEMORY
            )
        self.relearns += 1
        self.forget(cfg.relearn_keep)
        return True
