"""The single-series detector (robust z with persistence, CUSUM) used by the backtest."""

from __future__ import annotations

import math
import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.detect.series import CHECK_CUSUM, CHECK_Z, SeriesParams, SeriesState, series_step

PARAMS = SeriesParams(half_life=50, warmup=50, z_open=5.0, persist=3, clear_persist=10)
T0 = 1_400_000_000_000


def _run(values: list[float], params: SeriesParams = PARAMS) -> list[tuple[int, str, bool]]:
    state = SeriesState()
    out = []
    for i, value in enumerate(values):
        flag = series_step(state, T0 + i * 300_000, value, params)
        if flag is not None:
            out.append((i, flag.check, flag.opened))
    return out


def _noise(n: int, seed: int = 1, level: float = 50.0) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, 1) for _ in range(n)]


def test_quiet_series_raises_nothing() -> None:
    assert _run(_noise(600)) == []


def test_level_shift_opens_a_z_episode_after_persistence_and_closes_when_back() -> None:
    values = _noise(200) + [v + 20 for v in _noise(5, seed=2)] + _noise(100, seed=3)
    flags = _run(values)
    assert flags[0] == (202, CHECK_Z, True)  # third anomalous sample
    assert (CHECK_Z, False) in [(check, opened) for _, check, opened in flags[1:]]
    assert all(i >= 200 for i, _, _ in flags)


def test_slow_drift_is_caught_by_cusum_not_by_z() -> None:
    # Independent noise: the textbook slack (k = 0.5, h = 8) finds a 2.5-sigma shift that
    # never reaches z_open three times in a row.
    iid = msgspec.structs.replace(PARAMS, cusum_k=0.5, cusum_h=8.0)
    values = _noise(200) + [v + 2.5 for v in _noise(200, seed=4)]
    flags = _run(values, iid)
    assert flags and flags[0][1] == CHECK_CUSUM and flags[0][2]
    assert 200 <= flags[0][0] < 220
    assert _run(_noise(400), iid) == []  # and stays quiet without the shift


def test_single_spike_is_not_an_episode() -> None:
    values = _noise(200)
    values[150] = 500.0
    assert _run(values) == []


def test_duplicates_and_out_of_order_samples_are_dropped_and_counted() -> None:
    state = SeriesState()
    for i in range(10):
        series_step(state, T0 + i * 1000, 1.0, PARAMS)
    assert series_step(state, T0 + 9 * 1000, 99.0, PARAMS) is None
    assert series_step(state, T0 + 3 * 1000, 99.0, PARAMS) is None
    assert state.dropped == 2
    assert state.base.n == 10


def test_nan_and_infinity_are_skipped_and_counted() -> None:
    state = SeriesState()
    for i, value in enumerate([1.0, math.nan, 2.0, math.inf, -math.inf]):
        series_step(state, T0 + i * 1000, value, PARAMS)
    assert state.invalid == 3
    assert state.base.n == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), max_size=49))
def test_no_flag_before_warmup(values: list[float]) -> None:
    assert _run(values) == []


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), max_size=150),
    st.integers(0, 10),
)
def test_same_inputs_same_flags(values: list[float], seed: int) -> None:
    series = _noise(60, seed=seed) + values
    assert _run(series) == _run(series)
