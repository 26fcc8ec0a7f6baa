"""Matched false-alarm comparison: the two baselines' scores, rising-edge flags, picking the
best threshold within a budget, the split-half and leave-one-out checks."""

from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.backtest import run as bt
from pipeline.backtest import sweep as sw

T0 = 1_400_000_000_000
STEP = 300_000
WEEK_STEPS = bt.WEEK_MS // STEP


def _points(values: list[float]) -> list[tuple[int, float]]:
    return [(T0 + i * STEP, v) for i, v in enumerate(values)]


def test_rolling_zscore_is_against_the_previous_window_only() -> None:
    values = [float(i % 7) for i in range(20)] + [50.0]
    trace = sw.zscore_trace(_points(values), window=10)
    assert all(math.isnan(z) for _, z, _ in trace[:10])
    prior = values[10:20]
    expected = abs(50.0 - statistics.fmean(prior)) / statistics.pstdev(prior)
    assert math.isclose(trace[20][1], expected, rel_tol=1e-9)


def test_ewma_waits_for_its_warmup_and_skips_bad_values() -> None:
    values = [1.0, 2.0] * 10 + [math.nan, 40.0]
    trace = sw.ewma_trace(_points(values), alpha=0.1, warmup=10)
    assert all(math.isnan(z) for _, z, _ in trace[:10])
    assert math.isnan(trace[20][1]) and trace[21][1] > 10


def test_edge_flags_fire_on_each_rising_crossing_only() -> None:
    trace = [(i, z, "x") for i, z in enumerate([0, 5, 6, 1, math.nan, 7, 7, 0])]
    assert sw.edge_flags(trace, 4.0) == [(1, 5), (5, 7)]


def _run(detector: str, threshold: float, per_series: dict[str, tuple[int, int]]) -> sw.Run:
    """A run whose series have (hits, false alarms) as given, one window each, one week long."""
    results = []
    for name, (hits, alarms) in per_series.items():
        result = bt.SeriesResult(series=name, points=WEEK_STEPS + 1, start_ts=T0,
                                 end_ts=T0 + bt.WEEK_MS)
        result.windows = [(T0, T0 + STEP)]
        result.hits = [T0 if hits else None]
        result.false_alarms = alarms
        results.append(result)
    return sw.Run(detector, threshold, results)


def test_best_within_takes_the_highest_recall_whose_false_alarms_fit() -> None:
    runs = [_run("d", 3.0, {"a": (1, 5), "b": (1, 5)}),  # 5 / week
            _run("d", 4.0, {"a": (1, 1), "b": (0, 1)}),  # 1 / week, recall 0.5
            _run("d", 5.0, {"a": (1, 0), "b": (0, 1)})]  # 0.5 / week, recall 0.5
    assert sw.best_within(runs, 2.0) is runs[2]  # same recall: fewer false alarms
    assert sw.best_within(runs, 10.0) is runs[0]
    assert sw.best_within(runs, 0.1) is None
    assert sw.best_within(runs, 0.1, {"a"}) is runs[2]


def test_leave_one_out_scores_each_series_at_the_threshold_picked_on_the_others() -> None:
    runs = [_run("d", 3.0, {"a": (1, 0), "b": (1, 9), "c": (1, 9)}),
            _run("d", 6.0, {"a": (0, 0), "b": (1, 0), "c": (1, 0)})]
    loo = sw.leave_one_out({"d": runs}, 1.3)["d"]
    assert loo["thresholds"] == {"a": 6.0, "b": 6.0, "c": 6.0}
    assert (loo["hits"], loo["windows"], loo["false_alarms"]) == (2, 3, 0)


def test_the_split_is_fixed_by_name_order() -> None:
    assert sw.halves(["d", "a", "c", "b"]) == ({"a", "c"}, {"b", "d"})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 20)), min_size=2, max_size=8))
def test_more_false_alarm_budget_never_lowers_the_best_recall(
    outcomes: list[tuple[int, int]],
) -> None:
    runs = [_run("d", float(i), {"a": outcome, "b": (1 - outcome[0], outcome[1] // 2)})
            for i, outcome in enumerate(outcomes)]
    recalls = []
    for budget in (0.5, 1.0, 2.0, 5.0, 100.0):
        best = sw.best_within(runs, budget)
        recalls.append(-1.0 if best is None else best.summary().recall or 0.0)
    assert recalls == sorted(recalls)


def test_sweep_runs_every_detector_and_fleetpulse_matches_its_backtest_at_the_default() -> None:
    rng_values = [50.0 + (i * 7919 % 13) / 13 for i in range(1200)]
    for i in range(900, 960):
        rng_values[i] += 30.0
    points = _points(rng_values)
    data = [sw.Series("s", points, [(T0 + 890 * STEP, T0 + 1000 * STEP)])]
    params = sw.SeriesParams()
    swept = sw.sweep(data, params, {"fleetpulse": (params.sensitivity,), "zscore": (4.0,),
                                    "ewma": (5.0,)})
    assert set(swept) == set(sw.DETECTORS)
    direct = bt.run_series("s", points, params)
    assert [f.ts for f in swept["fleetpulse"][0].results[0].flags] == [f.ts for f in direct.flags]
    assert swept["fleetpulse"][0].summary().hits == 1
