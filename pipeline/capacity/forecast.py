"""When a quota runs out: a linear trend over the recent quota series, with its confidence.

A quota's usage moves in two ways: it creeps (the fleet and other teams grow into it) and it
jumps (a pool is created or deleted, a limit is raised). Only the creep says anything about the
future; a jump says where the level is now. So the trend is fitted (ordinary least squares)
over the points after the last jump, where a jump is a step between neighbours far outside
the steps' usual spread and larger than `min_step` of the limit. The spread is the larger of
the steps' scaled median absolute deviation (noise) and their mean absolute deviation: usage is
counted in whole devices, so a slow ramp is a staircase whose steps are mostly 0 (MAD 0) and
sometimes 1, and each 1 must not read as a jump.

No forecast (exhausts_at None, confidence 0) unless the fit has `min_points` points, the
slope is positive and it stands out of the noise: its t statistic (slope over its standard
error) at least `min_t`. A flat series has slope 0 and never gets one. The confidence is the
share of the variance the trend explains (R²), scaled down while there are few points.

Pure: the series comes in with its times; nothing here reads the clock.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

HOUR_MS = 3_600_000
MAD_SCALE = 1.4826  # MAD of a normal sample x this = its standard deviation


@dataclass(frozen=True)
class QuotaPoint:
    ts: int  # event time, ms
    usage: float
    limit: float


@dataclass(frozen=True)
class Forecast:
    exhausts_at: int | None  # ms; None: no trend towards the limit
    confidence: float  # 0..1; 0 when there is no forecast
    trend_per_h: float  # fitted growth of usage per hour (0 without a fit)
    points: int  # points the fit used (after the last jump)


NONE = Forecast(exhausts_at=None, confidence=0.0, trend_per_h=0.0, points=0)


@dataclass(frozen=True)
class ForecastRules:
    min_points: int = 6
    min_t: float = 4.0  # the slope must be this many standard errors above zero
    jump_mads: float = 6.0  # a jump is this many (scaled) MADs away from the median step
    min_step: float = 0.02  # ... and at least this fraction of the limit
    full_confidence_points: int = 12  # confidence is scaled down below this many points


def forecast(series: Sequence[QuotaPoint], rules: ForecastRules = ForecastRules()) -> Forecast:
    """The time the usage trend reaches the latest limit; NONE when there is no trend up."""
    points = sorted(series, key=lambda p: p.ts)
    segment = points[last_jump(points, rules) :]
    if len(segment) < rules.min_points:
        return NONE
    fit = _fit([p.ts for p in segment], [p.usage for p in segment])
    if fit is None or fit.slope <= 0 or fit.t < rules.min_t:
        return Forecast(None, 0.0, 0.0, len(segment))
    last = segment[-1]
    level = fit.at(last.ts)
    remaining = max(0.0, last.limit - level)
    exhausts_at = last.ts + round(remaining / fit.slope)
    scale = min(1.0, len(segment) / rules.full_confidence_points)
    confidence = round(max(0.0, min(1.0, fit.r2 * scale)), 3)
    return Forecast(exhausts_at, confidence, round(fit.slope * HOUR_MS, 6), len(segment))


def last_jump(points: Sequence[QuotaPoint], rules: ForecastRules = ForecastRules()) -> int:
    """Index of the first point after the last jump in usage (0 when there is none)."""
    steps = [b.usage - a.usage for a, b in itertools.pairwise(points)]
    if len(steps) < 2:
        return 0
    middle = _median(steps)
    deviations = [abs(s - middle) for s in steps]
    spread = max(MAD_SCALE * _median(deviations), sum(deviations) / len(deviations))
    start = 0
    for index, step in enumerate(steps):
        floor = rules.min_step * max(points[index + 1].limit, 1.0)
        if abs(step - middle) > max(rules.jump_mads * spread, floor):
            start = index + 1
    return start


@dataclass(frozen=True)
class _Fit:
    slope: float  # per ms
    intercept: float  # at x0
    x0: int
    t: float
    r2: float

    def at(self, ts: int) -> float:
        return self.intercept + self.slope * (ts - self.x0)


def _fit(xs: Sequence[int], ys: Sequence[float]) -> _Fit | None:
    """Least squares y = a + b (x - x0), with b's t statistic and R²; None when x is constant."""
    n, x0 = len(xs), xs[0]
    dx = [x - x0 for x in xs]
    mean_x, mean_y = sum(dx) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in dx)
    if sxx == 0:
        return None
    syy = sum((y - mean_y) ** 2 for y in ys)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(dx, ys, strict=True))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    residual = max(0.0, syy - slope * sxy)
    if syy == 0:  # a constant series: no trend at all
        return _Fit(0.0, intercept, x0, 0.0, 0.0)
    r2 = max(0.0, min(1.0, 1 - residual / syy))
    if residual <= 1e-12 * syy or n <= 2:  # an exact line: the slope is certain
        return _Fit(slope, intercept, x0, math.inf if slope > 0 else -math.inf, r2)
    stderr = math.sqrt(residual / (n - 2) / sxx)
    return _Fit(slope, intercept, x0, slope / stderr, r2)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
