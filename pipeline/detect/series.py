"""The reusable single-series detector: robust rolling baselines, a daily profile, level shifts
and spread changes, with one sensitivity setting.

One `SeriesState` per series; `series_step` takes one (ts, value) and returns a flag when an
anomaly episode opens or closes. `fleetpulse backtest` runs it over plain `timestamp,value`
histories. The score of a sample is the largest of three robust z-scores, each of one statistic
against that statistic's own history over the reference window (the last `reference_h` hours,
lagged by the recent window so that a change does not hide in its own yardstick):

- point: the value itself;
- level: the median of the recent window (`recent_h`, at least `min_recent` samples): a level
  shift, the two-window median test;
- spread: the logarithm of the recent window's interquartile range (spreads multiply, so
  their log moves symmetrically), upwards only: a variance change.

Each z is (statistic - median) / scale, the scale being the larger of IQR / 1.349 and the
10-90 % range / 2.563 (both the sd for normal data; the wider one keeps quantised or spiky
series from a near-zero IQR), floored at `min_scale_rel` of the value. Scoring the level and
spread against their own rolling history calibrates them for autocorrelation and window size
without constants per series.

Once the series has `season_days` of history, the point score is also measured against the
daily profile: the values seen at this time of day (± `season_window_h`) on the last
`season_days` days. A value inside their range scores 0 there, and the point score is the
smaller of the two, so a nightly batch spike that happens every day is not news, while a level
shift or a widening still is (those come from the plain view).

An episode opens when the score reaches `sensitivity` and closes after `clear_h` hours below
half of it. `sensitivity` is the one setting to move (`[detect] series_sensitivity`): lower
finds more and raises more false alarms. Everything else is structural (windows in hours, not
samples, so it reads series of any step) and was not fitted per series. The default 4.5 is the
threshold a leave-one-series-out pick chose most often on the NAB development series (bench/
detection.py reports that check; the series used to choose it are not a test of it).
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect.stats import finite

CHECK_POINT = "series.point"
CHECK_LEVEL = "series.level"
CHECK_SPREAD = "series.spread"
PARTS = (CHECK_POINT, CHECK_LEVEL, CHECK_SPREAD)

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
IQR_TO_SIGMA = 1.349  # IQR of a normal sample in sds
P10_P90_TO_SIGMA = 2.563  # 10-90 % range of a normal sample in sds
STEP_SAMPLES = 16  # the sampling step is the median of the first intervals


class SeriesParams(msgspec.Struct, frozen=True, kw_only=True):
    sensitivity: float = 4.5  # score (robust sds) at which an episode opens
    reference_h: float = 48.0  # history each statistic is compared with: two daily cycles
    recent_h: float = 1.0  # the recent window of the level and spread tests
    min_recent: int = 6  # ... never fewer samples than this (hourly series)
    min_reference: int = 24  # nor a reference shorter than this
    season_days: int = 7  # daily profile: this many past days
    season_window_h: float = 0.5  # ... at this time of day plus or minus this
    clear_h: float = 3.0  # calm this long (below half the sensitivity) ends an episode
    min_scale_rel: float = 0.01  # scale floor relative to the value's magnitude

    @classmethod
    def from_settings(cls, settings: DetectSettings) -> SeriesParams:
        return cls(
            sensitivity=settings.series_sensitivity, min_scale_rel=settings.series_min_scale_rel
        )


class Rolling:
    """The last `size` values in arrival order and sorted (quantiles without a sort each time)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fifo: deque[float] = deque()
        self.ordered: list[float] = []

    def push(self, x: float) -> None:
        self.fifo.append(x)
        bisect.insort(self.ordered, x)
        if len(self.fifo) > self.size:
            old = self.fifo.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]

    @property
    def full(self) -> bool:
        return len(self.fifo) >= self.size

    def quantile(self, q: float) -> float:
        s = self.ordered
        at = q * (len(s) - 1)
        lo = int(at)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (at - lo)

    def median_scale(self) -> tuple[float, float]:
        """Median and robust sd (the wider of the IQR and 10-90 % estimates)."""
        iqr = self.quantile(0.75) - self.quantile(0.25)
        wide = self.quantile(0.9) - self.quantile(0.1)
        return self.quantile(0.5), max(iqr / IQR_TO_SIGMA, wide / P10_P90_TO_SIGMA)


class Reference:
    """One statistic's history over the reference window, fed `lag` samples late."""

    def __init__(self, size: int, lag: int) -> None:
        self.window = Rolling(size)
        self.waiting: deque[float] = deque()
        self.lag = lag

    def z(self, x: float, floor: float) -> float | None:
        """Robust z of `x` against the history (None until it is full); then learns `x`."""
        out = None
        if self.window.full:
            median, scale = self.window.median_scale()
            out = (x - median) / max(scale, floor)
        self.waiting.append(x)
        if len(self.waiting) > self.lag:
            self.window.push(self.waiting.popleft())
        return out


class Scorer:
    """The per-sample score of one series, once its sampling step is known."""

    def __init__(self, step_ms: int, params: SeriesParams) -> None:
        self.params = params
        self.step_ms = step_ms
        recent = max(params.min_recent, round(params.recent_h * HOUR_MS / step_ms))
        size = max(params.min_reference, round(params.reference_h * HOUR_MS / step_ms))
        self.recent = Rolling(recent)
        self.refs = {part: Reference(size, recent) for part in PARTS}
        self.phases = max(1, round(DAY_MS / step_ms))
        self.around = round(params.season_window_h * HOUR_MS / step_ms)
        self.profile: dict[int, deque[float]] = {}

    def score(self, ts: int, x: float) -> tuple[float, str] | None:
        """The sample's score and the check that gave it (None while warming up)."""
        p = self.params
        floor = max(p.min_scale_rel * abs(x), 1e-12)
        self.recent.push(x)
        zs: dict[str, float] = {}
        point = self.refs[CHECK_POINT].z(x, floor)
        if point is not None:
            zs[CHECK_POINT] = abs(point)
        if self.recent.full:
            level = self.refs[CHECK_LEVEL].z(self.recent.quantile(0.5), floor)
            # spreads multiply: their logarithm is what moves symmetrically
            iqr = self.recent.quantile(0.75) - self.recent.quantile(0.25)
            spread = self.refs[CHECK_SPREAD].z(math.log(max(iqr, floor)), 1e-6)
            if level is not None:
                zs[CHECK_LEVEL] = abs(level)
            if spread is not None:
                zs[CHECK_SPREAD] = max(spread, 0.0)  # narrower than usual is not news
        phase = (ts % DAY_MS) // self.step_ms
        if CHECK_POINT in zs:
            seasonal = self._seasonal(phase, x, floor)
            if seasonal is not None:
                zs[CHECK_POINT] = min(zs[CHECK_POINT], seasonal)
        self.profile.setdefault(phase, deque(maxlen=p.season_days)).append(x)
        if not zs:
            return None
        check = max(zs, key=lambda k: zs[k])
        return zs[check], check

    def _seasonal(self, phase: int, x: float, floor: float) -> float | None:
        """How far `x` lies outside what this time of day saw on the last days (in the point
        reference's scale); None until every nearby phase has `season_days` / 2 days."""
        lo = hi = None
        for k in range(-self.around, self.around + 1):
            seen = self.profile.get((phase + k) % self.phases)
            if not seen or len(seen) < max(1, self.params.season_days // 2):
                return None
            a, b = min(seen), max(seen)
            lo = a if lo is None or a < lo else lo
            hi = b if hi is None or b > hi else hi
        assert lo is not None and hi is not None
        outside = x - hi if x > hi else lo - x if x < lo else 0.0
        _, scale = self.refs[CHECK_POINT].window.median_scale()
        return outside / max(scale, floor)


class Episodes:
    """Opens at a threshold, closes after `clear_ms` below half of it (hysteresis: a score
    hovering at the threshold is one episode, not many)."""

    def __init__(self, threshold: float, clear_ms: float) -> None:
        self.threshold = threshold
        self.clear_ms = clear_ms
        self.check = ""  # the check of the open episode, "" when none
        self.opened_ts = 0
        self.calm_since = 0  # first sample of the current calm run while open, 0 when none

    def step(self, ts: int, score: float, check: str) -> tuple[bool, str, int] | None:
        """(opened, check, episode start) when an episode opens or closes, else None."""
        if not self.check:
            if score < self.threshold:
                return None
            self.check, self.opened_ts, self.calm_since = check, ts, 0
            return True, check, ts
        if score >= self.threshold / 2:
            self.calm_since = 0
            return None
        self.calm_since = self.calm_since or ts
        if ts - self.calm_since < self.clear_ms:
            return None
        closed = (False, self.check, self.opened_ts)
        self.check, self.opened_ts, self.calm_since = "", 0, 0
        return closed


class SeriesState:
    """One series' detector state (plain Python: it holds rolling windows, not a table row)."""

    def __init__(self) -> None:
        self.last_ts = 0
        self.dropped = 0  # duplicate or out-of-order samples ignored
        self.invalid = 0  # NaN / infinite values ignored
        self.steps: list[int] = []  # the first intervals, until the step is known
        self.scorer: Scorer | None = None
        self.episodes: Episodes | None = None


class SeriesFlag(msgspec.Struct, frozen=True, kw_only=True):
    ts: int
    check: str
    opened: bool  # True: an anomaly episode starts; False: it ended
    episode_ts: int
    score: float
    value: float
    baseline: float


def series_score(
    state: SeriesState, ts: int, value: float, params: SeriesParams
) -> tuple[float, str] | None:
    """Feed one sample; its score and check, or None (warming up, invalid or out of order)."""
    if ts <= state.last_ts:
        state.dropped += 1
        return None
    if state.last_ts:
        state.steps.append(ts - state.last_ts)
    state.last_ts = ts
    if not finite(value):
        state.invalid += 1
        return None
    if state.scorer is None:
        if len(state.steps) < STEP_SAMPLES:
            return None
        state.scorer = Scorer(sorted(state.steps)[len(state.steps) // 2], params)
        state.steps = []
    return state.scorer.score(ts, value)


def series_step(
    state: SeriesState, ts: int, value: float, params: SeriesParams
) -> SeriesFlag | None:
    """Feed one sample; returns a flag when an episode opens or closes, else None."""
    scored = series_score(state, ts, value, params)
    if scored is None or state.scorer is None:
        return None
    if state.episodes is None:
        # calm for clear_h, but never for fewer than 3 samples (coarse series)
        clear_ms = max(params.clear_h * HOUR_MS, 3 * state.scorer.step_ms)
        state.episodes = Episodes(params.sensitivity, clear_ms)
    score, check = scored
    change = state.episodes.step(ts, score, check)
    if change is None:
        return None
    opened, check, since = change
    point = state.scorer.refs[CHECK_POINT].window
    baseline = point.quantile(0.5) if point.full else value
    return SeriesFlag(ts=ts, check=check, opened=opened, episode_ts=since, score=score,
                      value=value, baseline=baseline)
