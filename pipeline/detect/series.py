"""The reusable single-series detector: robust z with persistence, plus CUSUM for slow drift.

One `SeriesState` per series; `series_step` takes one (ts, value) and returns a flag when an
anomaly episode opens or closes. `fleetpulse backtest` runs it over plain `timestamp,value`
histories; the GPU detector uses the same `Baseline` arithmetic on peer-normalised series.
"""

from __future__ import annotations

import msgspec

from pipeline.config import DetectSettings
from pipeline.detect.stats import Baseline, advance, alpha_for, cusum, finite, learn, zscore

CHECK_Z = "series.zscore"
CHECK_CUSUM = "series.cusum"


class SeriesParams(msgspec.Struct, frozen=True, kw_only=True):
    half_life: int = 288
    warmup: int = 288
    z_open: float = 5.0
    persist: int = 3  # consecutive samples beyond z_open before a z episode opens
    clear_persist: int = 36  # consecutive calm samples before an episode closes
    # Real series are autocorrelated: a level that wanders by one scale for hours is normal,
    # so the slack is larger than the textbook 0.5 (which assumes independent samples).
    cusum_k: float = 2.0
    cusum_h: float = 24.0
    cusum_cap: float = 4.0  # one sample adds at most this much to a CUSUM sum
    clip_z: float = 3.0
    anomaly_adapt: float = 0.05
    min_scale_abs: float = 1e-9
    min_scale_rel: float = 0.01

    @classmethod
    def from_settings(cls, settings: DetectSettings) -> SeriesParams:
        return cls(
            half_life=settings.series_half_life,
            warmup=settings.series_warmup,
            z_open=settings.series_z,
            persist=settings.series_persist,
            clear_persist=settings.series_clear,
            cusum_k=settings.series_cusum_k,
            cusum_h=settings.series_cusum_h,
            clip_z=settings.clip_z,
            anomaly_adapt=settings.anomaly_adapt,
            min_scale_rel=settings.series_min_scale_rel,
        )


class SeriesState(msgspec.Struct, kw_only=True):
    base: Baseline = msgspec.field(default_factory=Baseline)
    last_ts: int = 0
    dropped: int = 0  # duplicate or out-of-order samples ignored
    invalid: int = 0  # NaN / infinite values ignored
    streak: int = 0  # > 0: consecutive anomalous samples; < 0: consecutive calm ones
    open_check: str = ""  # the check of the open episode, "" when none
    open_ts: int = 0


class SeriesFlag(msgspec.Struct, frozen=True, kw_only=True):
    ts: int
    check: str
    opened: bool  # True: an anomaly episode starts; False: it ended
    episode_ts: int
    score: float
    value: float
    baseline: float


def series_step(
    state: SeriesState, ts: int, value: float, params: SeriesParams
) -> SeriesFlag | None:
    """Feed one sample; returns a flag when an episode opens or closes, else None."""
    if ts <= state.last_ts:
        state.dropped += 1
        return None
    state.last_ts = ts
    if not finite(value):
        state.invalid += 1
        return None
    base = state.base
    level = base.mean if base.mean >= 0 else -base.mean
    floor = max(params.min_scale_abs, params.min_scale_rel * level)
    warm = base.n >= params.warmup
    z = zscore(base, value, floor) if warm else 0.0
    drift = cusum(base, z, params.cusum_k, params.cusum_cap) if warm else 0.0
    # Capped sums: a long excursion keeps its episode open but ends soon after it does.
    base.hi, base.lo = min(base.hi, 2 * params.cusum_h), min(base.lo, 2 * params.cusum_h)
    anomalous = z >= params.z_open or z <= -params.z_open
    state.streak = advance(state.streak, anomalous)
    flag = _transition(state, ts, value, z, drift, params)
    rate = params.anomaly_adapt if anomalous or state.open_check else 1.0
    learn(base, value, alpha_for(params.half_life), params.warmup, params.clip_z, floor, rate)
    return flag


def _transition(
    state: SeriesState, ts: int, value: float, z: float, drift: float, params: SeriesParams
) -> SeriesFlag | None:
    base = state.base
    if not state.open_check:
        if state.streak >= params.persist:
            check, score = CHECK_Z, z
        elif abs(drift) >= params.cusum_h:
            check, score = CHECK_CUSUM, drift
        else:
            return None
        state.open_check, state.open_ts = check, ts
        state.streak = 0  # calm samples count from the opening
        return SeriesFlag(
            ts=ts,
            check=check,
            opened=True,
            episode_ts=ts,
            score=score,
            value=value,
            baseline=base.mean,
        )
    drifting = abs(drift) >= params.cusum_h / 2
    if state.streak > -params.clear_persist or drifting:
        return None
    flag = SeriesFlag(
        ts=ts,
        check=state.open_check,
        opened=False,
        episode_ts=state.open_ts,
        score=z,
        value=value,
        baseline=base.mean,
    )
    state.open_check, state.open_ts = "", 0
    base.hi = base.lo = 0.0
    return flag
