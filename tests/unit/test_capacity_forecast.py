"""When a quota runs out: flat, ramps, steps and noise (pipeline/capacity/forecast.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.capacity.forecast import HOUR_MS, NONE, QuotaPoint, forecast, last_jump

T0 = 1_767_225_600_000  # 2026-01-01
STEP_MS = 300_000  # a point every 5 minutes


def series(usages: list[float], limit: float = 100.0) -> list[QuotaPoint]:
    return [QuotaPoint(T0 + i * STEP_MS, u, limit) for i, u in enumerate(usages)]


def test_a_flat_series_never_runs_out() -> None:
    result = forecast(series([40.0] * 48))
    assert result.exhausts_at is None
    assert result.confidence == 0.0
    assert result.trend_per_h == 0.0


def test_a_linear_ramp_runs_out_where_the_line_meets_the_limit() -> None:
    # 2 units per 5 minutes = 24 per hour, from 10: the limit of 100 is 90 units after the
    # first point, i.e. 3.75 h after T0
    result = forecast(series([10.0 + 2 * i for i in range(24)]))
    assert result.exhausts_at == T0 + int(3.75 * HOUR_MS)
    assert result.trend_per_h == 24.0
    assert result.confidence == 1.0
    assert result.points == 24


def test_a_step_change_is_a_new_level_not_a_trend() -> None:
    # a pool created: usage jumps from 20 to 60 and stays; a fit over everything would see a
    # steep ramp and call the quota spent within the hour
    usages = [20.0] * 24 + [60.0] * 24
    assert last_jump(series(usages)) == 24
    assert forecast(series(usages)).exhausts_at is None


def test_a_ramp_after_a_step_is_fitted_from_the_step() -> None:
    usages = [20.0] * 12 + [50.0 + i for i in range(24)]  # +1 per 5 min = 12/h from 50
    result = forecast(series(usages))
    assert result.points == 24
    assert result.trend_per_h == 12.0
    assert result.exhausts_at == T0 + 12 * STEP_MS + int(50 / 12 * HOUR_MS)


def test_a_noisy_ramp_is_found_near_its_true_exhaustion_with_less_confidence() -> None:
    rng = random.Random(7)
    usages = [10.0 + 2 * i + rng.gauss(0, 2.0) for i in range(36)]
    result = forecast(series(usages))
    assert result.exhausts_at is not None
    true_end = T0 + int(3.75 * HOUR_MS)
    assert abs(result.exhausts_at - true_end) < 0.25 * HOUR_MS
    assert 0.8 < result.confidence < 1.0


def test_noise_around_a_level_is_not_a_trend() -> None:
    rng = random.Random(11)
    usages = [50.0 + rng.gauss(0, 3.0) for _ in range(48)]
    assert forecast(series(usages)).exhausts_at is None


def test_too_few_points_say_nothing() -> None:
    assert forecast(series([10.0, 20.0, 30.0])) == NONE


def test_a_falling_series_never_runs_out() -> None:
    assert forecast(series([90.0 - i for i in range(24)])).exhausts_at is None


@given(
    level=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    headroom=st.floats(min_value=0.001, max_value=1e6, allow_nan=False),
    gaps=st.lists(st.integers(min_value=1, max_value=3_600_000), min_size=0, max_size=200),
)
def test_a_flat_series_never_predicts_exhaustion(
    level: float, headroom: float, gaps: list[int]
) -> None:
    ts, points = T0, [QuotaPoint(T0, level, level + headroom)]
    for gap in gaps:
        ts += gap
        points.append(QuotaPoint(ts, level, level + headroom))
    result = forecast(points)
    assert result.exhausts_at is None
    assert result.confidence == 0.0


def test_a_slow_ramp_in_whole_devices_is_a_staircase_not_a_run_of_jumps() -> None:
    # +1 device every 20 minutes (every fourth point): steps are mostly 0, sometimes 1
    usages = [float(16 + i // 4) for i in range(36)]
    assert last_jump(series(usages, limit=24.0)) == 0
    result = forecast(series(usages, limit=24.0))
    assert result.exhausts_at is not None
    assert result.trend_per_h == pytest.approx(3.0, rel=0.1)
