"""Online estimate of one backend's time per output token as a function of its in-flight count.

`TPOT(n) = alpha + beta * n` (calibration.md's affine step model over the tokens a step yields),
fitted from finished responses, one point each (mean in-flight while it decoded, decode seconds /
(tokens - 1)), by exponentially weighted least squares made fit for live traffic: points weighted
by relative error (low-load points pin the intercept); robust (beyond 2 running scales a Huber
weight, beyond 6 none, so a decode window that caught a long prefill moves nothing); always
identifiable (a weak prior slope stands in while the data has no spread in n); forgetting (a
half-life in observations, and a sustained bias of the residuals, such as a restart with other
settings, drops almost all evidence at once, keeping the old line as the prior). O(1) per
observation; `predict` is one multiply-add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EstimatorConfig:
    """Tuning of the fit; every default is profile-free (no model, GPU or draft constants)."""

    half_life: float = 200.0  # observations until old evidence counts half
    prior_slope_ratio: float = 0.1  # prior beta/alpha per request: geometric middle of plain and EAGLE step shapes
    prior_weight: float = 0.2  # prior strength, in observations times (requests of spread in n)^2
    huber_k: float = 2.0  # residuals beyond k running scales get weight k*scale/|r| ...
    reject_k: float = 3.0  # ... and beyond reject_k times that, none
    scale_floor: float = 0.01  # relative noise floor, so near-deterministic data does not turn all into outliers
    scale_cap: float = 0.5  # a rough early fit must not make every later point look normal
    scale_rate: float = 0.05  # EWMA rate of the residual scale
    robust_after: int = 5  # observations before residuals are trusted enough to down-weight
    prior_slope_doubt: float = 3.0  # how far off (x slope) a prior-made slope may be, when judging residuals
    shift_rate: float = 0.1  # EWMA rate of the change detector (about the last 10 observations)
    shift_sign: float = 0.75  # |mean sign of residuals| that signals a consistent shift ...
    shift_size: float = 0.1  # ... when the mean relative residual is also at least this
    relearn_keep: float = 0.02  # share of old evidence kept when a shift is detected
    full_weight_tokens: int = 64  # responses with fewer decode tokens count proportionally less


@dataclass(frozen=True)
class Fit:
    """A fitted line: TPOT(n) = alpha + beta*n, in seconds."""

    alpha: float
    beta: float

    def at(self, n: float) -> float:
        """Predicted seconds per output token at in-flight count n."""
        return self.alpha + self.beta * n


class TpotEstimator:
    """Robust, forgetting fit of TPOT(n) for one backend; feed it with `observe`, read `predict`."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self._decay = 0.5 ** (1.0 / self.config.half_life)
        self.alpha = math.nan
        self.beta = math.nan
        self.fitted = False
        self.observations = 0  # since creation
        self.relearns = 0
        self.evidence = 0.0  # undecayed sum of observation weights since the last relearn or reset
        self._scale = 0.1
        self._prior_ratio = self.config.prior_slope_ratio
        self._shift_sign = 0.0
        self._shift_mean = 0.0
        self._since_relearn = 0
        # Decayed weighted sums of 1, n, n^2, y, n*y.
        self._w = self._wn = self._wnn = self._wy = self._wny = 0.0

    def predict(self, n: float) -> float:
        """Predicted seconds per output token with n requests in flight (NaN before the first fit)."""
        return self.alpha + self.beta * n

    @property
    def fit(self) -> Fit | None:
        """The current line, or None before any observation."""
        return Fit(self.alpha, self.beta) if self.fitted else None

    def observe(self, n: float, tpot: float, tokens: int | None = None) -> None:
        """Add one response: `n` mean in-flight while it decoded, `tpot` its seconds per token.

        `tokens` (the decode tokens behind `tpot`) scales its weight: a short response's TPOT is
        a handful of steps and, under speculation, of random acceptance draws.
        """
        if not (tpot > 0.0 and math.isfinite(tpot) and n >= 0.0 and math.isfinite(n)):
            return
        cfg = self.config
        weight = 1.0 if tokens is None else min(1.0, max(tokens, 1) / cfg.full_weight_tokens)
        self.observations += 1
        if self.fitted:
            weight *= self._robust_weight(n, tpot)
            # Noise scales with the TPOT level (acceptance draws, jitter), so points are weighted for
            # relative error: a point at low load pins the intercept better than one at high load.
            weight *= (self._wy / self._w / self.predict(n)) ** 2 if self._w > 0.0 else 1.0
        self._add(n, tpot, weight)
        self._solve()

    def forget(self, keep: float) -> None:
        """Scale all evidence down to `keep` (0 forgets everything); the fit is kept as a starting point.

        The fitted line's shape (beta/alpha) becomes the prior's: what usually changes a backend
        (acceptance length, a restart) scales its whole line, so until the new points have spread
        in n, the old shape at the new level is the best guess.
        """
        if self.fitted and self.alpha > 0.0:
            self._prior_ratio = self.beta / self.alpha
        for name in ("_w", "_wn", "_wnn", "_wy", "_wny"):
            setattr(self, name, getattr(self, name) * keep)
        self.evidence *= keep
        self._shift_sign = self._shift_mean = 0.0
        self._since_relearn = 0

    def describe(self) -> dict[str, Any]:
        """Fitted parameters and fit health, for /admin/status."""
        return {
            "alpha_seconds": self.alpha if self.fitted else None,
            "beta_seconds_per_request": self.beta if self.fitted else None,
            "observations": self.observations,
            "effective_observations": round(self._w, 2),
            "residual_scale": round(self._scale, 4),
            "relearns": self.relearns,
        }

    def _robust_weight(self, n: float, tpot: float) -> float:
        """Huber weight of a new point against the current fit; also runs the change detector."""
        cfg = self.config
        predicted = self.predict(n)
        r = tpot / predicted - 1.0 if predicted > 0.0 else 0.0
        self._since_relearn += 1
        if self._since_relearn <= cfg.robust_after:
            # Just (re)started: too few points to call any of them an outlier.
            self._scale = min(max(self._scale + 0.5 * (abs(r) * 1.2533 - self._scale), cfg.scale_floor), cfg.scale_cap)
            return 1.0
        # Residuals are judged against the prediction's own uncertainty too: where the data has no
        # spread in n the slope is mostly the prior's, so far from the data's centre a large
        # residual is news about the slope, not an outlier.
        w = self._w
        n_mean, y_mean = self._wn / w, self._wy / w
        spread = w * max(self._wnn / w - n_mean * n_mean, 0.0)
        prior_share = cfg.prior_weight / (spread + cfg.prior_weight)
        slope_sd = prior_share * cfg.prior_slope_doubt * self.beta + self._scale * y_mean / math.sqrt(spread + cfg.prior_weight)
        base = cfg.huber_k * self._scale
        limit = base + abs(n - n_mean) * slope_sd / predicted
        # Change detection on residuals clipped to a few scales, so outliers cannot fake a shift
        # while a real one (every point off by the same margin) still gets through.
        clipped = max(-1.5 * base, min(1.5 * base, r))
        self._shift_sign += cfg.shift_rate * ((1.0 if r > 0 else -1.0 if r < 0 else 0.0) - self._shift_sign)
        self._shift_mean += cfg.shift_rate * (clipped - self._shift_mean)
        if (
            self._since_relearn * cfg.shift_rate >= 1.0
            and abs(self._shift_sign) >= cfg.shift_sign
            and abs(self._shift_mean) >= cfg.shift_size
        ):
            # Most recent points sit on one side of the line by a material margin: the backend
            # changed. Keep a sliver of the old fit so the next points re-shape it fast.
            self.relearns += 1
            self.forget(cfg.relearn_keep)
        # The scale follows |r| (x1.2533: mean absolute deviation to sigma for normal noise),
        # with outliers clipped so a burst of them cannot inflate it.
        self._scale += cfg.scale_rate * (min(abs(r), base) * 1.2533 - self._scale)
        self._scale = min(max(self._scale, cfg.scale_floor), cfg.scale_cap)
        if abs(r) <= limit:
            return 1.0
        # Huber beyond the limit, and nothing at all beyond `reject_k` limits: spikes and stalls
        # are one-sided, so even a bounded pull from each would bias the (small) intercept.
        return limit / abs(r) if abs(r) <= cfg.reject_k * limit else 0.0

    def _add(self, n: float, y: float, weight: float) -> None:
        d = self._decay
        self._w = self._w * d + weight
        self._wn = self._wn * d + weight * n
        self._wnn = self._wnn * d + weight * n * n
        self._wy = self._wy * d + weight * y
        self._wny = self._wny * d + weight * n * y
        self.evidence += weight

    def _solve(self) -> None:
        cfg = self.config
        w = self._w
        if w <= 0.0:
            return
        n_mean = self._wn / w
        y_mean = self._wy / w
        var_n = max(self._wnn / w - n_mean * n_mean, 0.0)
        cov_ny = self._wny / w - n_mean * y_mean
        prior_beta = self._prior_ratio * y_mean / (1.0 + self._prior_ratio * n_mean)
        beta = max((w * cov_ny + cfg.prior_weight * prior_beta) / (w * var_n + cfg.prior_weight), 0.0)
        alpha = y_mean - beta * n_mean
        floor = 0.02 * y_mean
        if alpha < floor:
            # A slope so steep the line would predict ~0 s per token for a lone request: keep the
            # intercept positive and let the line still pass through the data's centre.
            alpha = floor
            beta = (y_mean - alpha) / n_mean if n_mean > 0.0 else 0.0
        self.alpha, self.beta, self.fitted = alpha, beta, True
