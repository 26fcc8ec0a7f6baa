"""Small online statistics: a robust EW baseline with CUSUM, counter deltas, median/MAD.

Everything here is plain floats on small structs, because it runs for every metric of every
device of every scrape: no numpy (slower than floats for a handful of values), no allocation
per update.
"""

from __future__ import annotations

import math

import msgspec

# E|X - mu| = sigma * sqrt(2/pi) for a normal X: turns a mean absolute deviation into a sigma.
MEAN_ABS_DEV_TO_SIGMA = math.sqrt(math.pi / 2)
# MAD = 0.6745 sigma for a normal sample.
MAD_TO_SIGMA = 1.4826
SCALE_RATE = 0.25


class Baseline(msgspec.Struct, gc=False):
    """Exponentially weighted mean and mean absolute deviation of one series, plus CUSUM sums.

    The scale is the EW mean absolute deviation, not the variance: one wild sample moves it
    far less. Updates are Huber-clipped at `clip_z` scales, so outliers cannot drag the
    baseline towards themselves, and while a series is anomalous it learns at a reduced rate,
    so a persistent fault is not quietly absorbed as the new normal.
    """

    n: int = 0
    mean: float = 0.0
    dev: float = 0.0
    hi: float = 0.0  # one-sided CUSUM sums, in scales
    lo: float = 0.0


def alpha_for(half_life: int) -> float:
    """EW weight of the newest sample so that a sample's weight halves after `half_life`."""
    return float(1.0 - 0.5 ** (1.0 / half_life))


def scale_of(base: Baseline, floor: float) -> float:
    """The baseline's sigma estimate, never below `floor` (flat series would divide by zero)."""
    scale = base.dev * MEAN_ABS_DEV_TO_SIGMA
    return scale if scale > floor else floor


def zscore(base: Baseline, x: float, floor: float) -> float:
    """Robust z of `x` against the baseline as it was before `x`."""
    return (x - base.mean) / scale_of(base, floor)


def learn(
    base: Baseline, x: float, alpha: float, warmup: int, clip_z: float, floor: float, rate: float
) -> None:
    """Add `x` to the baseline; `rate` (0..1) scales the learning rate (low while anomalous)."""
    n = base.n + 1
    base.n = n
    if n == 1:
        base.mean = x
        return
    # Bias-corrected start: a plain running mean until the EW weight takes over.
    a = 1.0 / n if n * alpha < 1.0 else alpha
    r = x - base.mean
    if n > warmup:
        a *= rate
        limit = clip_z * scale_of(base, floor)
        if r > limit:
            r = limit
        elif r < -limit:
            r = -limit
    base.mean += a * r
    # After warm-up the scale learns slower than the level: a drift must not widen its own
    # yardstick as fast as it moves (river's CUSUM freezes sigma; this only slows it).
    b = a * SCALE_RATE if n > warmup else a
    base.dev += b * ((r if r >= 0 else -r) - base.dev)


def cusum(base: Baseline, z: float, k: float, cap: float) -> float:
    """Advance both one-sided CUSUM sums by z (capped, so one spike is not a drift)."""
    if z > cap:
        z = cap
    elif z < -cap:
        z = -cap
    hi = base.hi + z - k
    lo = base.lo - z - k
    base.hi = hi if hi > 0.0 else 0.0
    base.lo = lo if lo > 0.0 else 0.0
    return base.hi if base.hi >= base.lo else -base.lo


def advance(streak: int, bad: bool) -> int:
    """Run length of a condition: > 0 consecutive bad samples, < 0 consecutive good ones."""
    if bad:
        return streak + 1 if streak > 0 else 1
    return streak - 1 if streak < 0 else -1


def counter_delta(last: float | None, value: float) -> float:
    """Increase of a raw counter since `last`; a drop is a reset (driver reload, GPU reset), so
    the new value is what accumulated since. Never negative; 0 for the first observation."""
    if last is None:
        return 0.0
    delta = value - last
    if delta >= 0.0:
        return delta
    return value if value > 0.0 else 0.0


def finite(value: float | None) -> bool:
    return value is not None and value == value and value not in (math.inf, -math.inf)


def median(values: list[float]) -> float:
    """Median of a short non-empty list (sorts a copy)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def median_mad(values: list[float]) -> tuple[float, float]:
    """Median and median absolute deviation of a short non-empty list."""
    mid = median(values)
    return mid, median([v - mid if v >= mid else mid - v for v in values])
