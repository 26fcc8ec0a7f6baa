"""Online statistics: counter deltas, robust baselines, CUSUM, medians."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.detect.stats import (
    Baseline,
    advance,
    alpha_for,
    counter_delta,
    cusum,
    learn,
    median,
    median_mad,
    zscore,
)


@pytest.mark.parametrize(
    ("last", "value", "expected"),
    [
        (None, 7.0, 0.0),  # first observation: no rate yet
        (5.0, 9.0, 4.0),  # normal growth
        (9.0, 9.0, 0.0),  # unchanged
        (9.0, 2.0, 2.0),  # reset (driver reload, GPU reset): counts from zero
        (9.0, 0.0, 0.0),  # reset to zero
        (9.0, -3.0, 0.0),  # garbage below zero never yields a negative rate
    ],
)
def test_counter_delta(last: float | None, value: float, expected: float) -> None:
    assert counter_delta(last, value) == expected


@settings(max_examples=60)
@given(st.lists(st.floats(-1e12, 1e12, allow_nan=False), min_size=1, max_size=40))
def test_counter_delta_never_negative_across_resets(values: list[float]) -> None:
    last: float | None = None
    for value in values:
        assert counter_delta(last, value) >= 0.0
        last = value


def test_monotonic_counter_deltas_sum_to_its_growth() -> None:
    values = [10.0, 12.0, 12.0, 20.0, 21.5]
    deltas = [counter_delta(a, b) for a, b in zip([None, *values], values, strict=False)]
    assert sum(deltas) == values[-1] - values[0]


def test_half_life_halves_the_weight() -> None:
    alpha = alpha_for(10)
    assert (1 - alpha) ** 10 == pytest.approx(0.5)


def _trained(values: list[float], warmup: int = 5) -> Baseline:
    base = Baseline()
    for value in values:
        learn(base, value, alpha_for(20), warmup, 3.0, 0.01, 1.0)
    return base


def test_baseline_learns_level_and_scale() -> None:
    base = _trained([10.0, 11.0, 9.0, 10.0] * 20)
    assert base.mean == pytest.approx(10.0, abs=0.3)
    assert 0.3 < base.dev < 1.0
    assert zscore(base, 10.0, 0.01) == pytest.approx(0.0, abs=0.5)
    assert zscore(base, 20.0, 0.01) > 8


def test_one_outlier_after_warmup_cannot_drag_the_baseline() -> None:
    base = _trained([10.0, 11.0, 9.0, 10.0] * 20)
    before = base.mean
    learn(base, 1e9, alpha_for(20), 5, 3.0, 0.01, 1.0)
    # clipped at 3 scales, weighted by alpha: a fraction of a unit, not 1e9 * alpha
    assert abs(base.mean - before) < 1.0


def test_low_learning_rate_while_anomalous_keeps_the_fault_visible() -> None:
    normal = _trained([10.0, 11.0, 9.0, 10.0] * 20)
    shifted = _trained([10.0, 11.0, 9.0, 10.0] * 20)
    for _ in range(40):
        learn(normal, 15.0, alpha_for(20), 5, 3.0, 0.01, 1.0)
        learn(shifted, 15.0, alpha_for(20), 5, 3.0, 0.01, 0.05)
    assert zscore(shifted, 15.0, 0.01) > zscore(normal, 15.0, 0.01) + 2


def test_cusum_catches_a_small_sustained_shift_but_not_one_spike() -> None:
    spike = Baseline()
    assert cusum(spike, 100.0, 0.5, 4.0) == 3.5  # capped: one sample adds at most cap - k
    drift = Baseline()
    sums = [cusum(drift, 1.5, 0.5, 4.0) for _ in range(10)]
    assert sums[-1] == pytest.approx(10.0)
    assert cusum(drift, -20.0, 0.5, 4.0) == pytest.approx(5.5)  # drains, never below zero


@pytest.mark.parametrize(
    ("values", "mid", "mad"),
    [([5.0], 5.0, 0.0), ([1.0, 3.0], 2.0, 1.0), ([1.0, 2.0, 100.0], 2.0, 1.0)],
)
def test_median_mad(values: list[float], mid: float, mad: float) -> None:
    assert median(values) == mid
    assert median_mad(values) == (mid, mad)


def test_advance_counts_runs() -> None:
    streak = 0
    for bad in (True, True, False, False, False, True):
        streak = advance(streak, bad)
    assert streak == 1
    assert advance(-3, False) == -4
