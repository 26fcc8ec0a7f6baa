"""The single-series detector used by the backtest: robust rolling baselines, the daily
profile, level and spread changes, episodes with hysteresis."""

from __future__ import annotations

import math
import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.detect.series import (
    CHECK_LEVEL,
    CHECK_POINT,
    CHECK_SPREAD,
    STEP_SAMPLES,
    SeriesParams,
    SeriesState,
    series_step,
)

# short windows keep the tests fast: 4 h of reference, 30 min recent, 1 h to clear
PARAMS = SeriesParams(reference_h=4.0, recent_h=0.5, clear_h=1.0)
STEP = 300_000  # 5 minutes
DAY = 288  # samples
T0 = 1_400_000_000_000 - 1_400_000_000_000 % 86_400_000  # midnight UTC
WARM = STEP_SAMPLES + 1 + 48 + 6  # step learning, then the reference filled behind the lag


def _run(values: list[float], params: SeriesParams = PARAMS) -> list[tuple[int, str, bool]]:
    state = SeriesState()
    out = []
    for i, value in enumerate(values):
        flag = series_step(state, T0 + i * STEP, value, params)
        if flag is not None:
            out.append((i, flag.check, flag.opened))
    return out


def _noise(n: int, seed: int = 1, level: float = 50.0, sd: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, sd) for _ in range(n)]


def test_quiet_series_raises_nothing() -> None:
    for seed in range(3):
        assert _run(_noise(3 * DAY, seed=seed)) == []


def test_level_shift_opens_an_episode_at_once_and_it_closes_after_the_calm_time() -> None:
    values = _noise(400) + [v + 20 for v in _noise(12, seed=2)] + _noise(200, seed=3)
    flags = _run(values)
    assert flags[0][0] in range(400, 403) and flags[0][2]
    assert flags[0][1] in (CHECK_POINT, CHECK_LEVEL)
    closes = [i for i, _, opened in flags if not opened]
    assert closes and 412 + 12 <= closes[0] < 412 + 40  # an hour of calm after the shift ends
    assert all(i >= 400 for i, _, _ in flags)


def test_a_wider_spread_without_a_level_change_is_found() -> None:
    values = _noise(400) + _noise(120, seed=5, sd=6.0)
    flags = _run(values)
    assert flags and flags[0][2] and 400 <= flags[0][0] < 440
    assert flags[0][1] in (CHECK_POINT, CHECK_SPREAD)


def test_a_spike_every_day_at_the_same_time_is_learnt_but_one_at_another_time_is_not() -> None:
    days = 10
    values = _noise(days * DAY, seed=7)
    for day in range(days):
        values[day * DAY + 36] += 30  # 03:00 every day: a nightly batch job
    odd = 9 * DAY + 150  # 12:30 on the last day
    values[odd] += 30
    flags = [i for i, _, opened in _run(values, msgspec.structs.replace(PARAMS, reference_h=48.0))
             if opened]
    assert odd in flags
    late = [i for i in flags if i >= 5 * DAY and i != odd]
    assert late == []  # once the profile has the nightly spike, it is normal


def test_duplicates_and_out_of_order_samples_are_dropped_and_counted() -> None:
    state = SeriesState()
    for i in range(10):
        series_step(state, T0 + i * 1000, 1.0, PARAMS)
    assert series_step(state, T0 + 9 * 1000, 99.0, PARAMS) is None
    assert series_step(state, T0 + 3 * 1000, 99.0, PARAMS) is None
    assert state.dropped == 2


def test_nan_and_infinity_are_skipped_and_counted() -> None:
    state = SeriesState()
    for i, value in enumerate([1.0, math.nan, 2.0, math.inf, -math.inf]):
        series_step(state, T0 + i * 1000, value, PARAMS)
    assert state.invalid == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), max_size=WARM))
def test_no_flag_before_warmup(values: list[float]) -> None:
    assert _run(values) == []


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), max_size=150),
    st.integers(0, 10),
    st.integers(-8, 8),
    st.booleans(),
)
def test_flags_do_not_depend_on_units_or_sign(
    values: list[float], seed: int, power: int, negate: bool
) -> None:
    # Scaling by a power of two is exact in floating point, so every robust z is unchanged;
    # so is the sign (both tails are scored alike).
    series = _noise(80, seed=seed) + values
    factor = (-1.0 if negate else 1.0) * 2.0**power
    assert _run([v * factor for v in series]) == _run(series)
