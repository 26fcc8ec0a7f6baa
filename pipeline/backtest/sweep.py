"""Detectors compared at matched false-alarm rates: FleetPulse's series detector and two plain
baselines, each swept over its threshold on the same series in the same run.

- `zscore`: rolling z-score, mean and sd of the previous 288 samples, flag when |z| > threshold;
- `ewma`: exponentially weighted mean and variance (alpha 0.02), flag when |z| > threshold.

The baselines flag each time |z| crosses the threshold (a rising edge), as a plain threshold
alert does; FleetPulse flags the opening of an episode (pipeline/detect/series.py). Every
detector's score is computed once per series; a threshold only changes which samples flag,
so a sweep is cheap. Flags are scored by `pipeline.backtest.run.score_series` (NAB windows: a hit
is a flag inside a window, a false alarm a flag outside every window).

Comparison: for each false-alarm budget (per series-week), each detector's best recall over
its thresholds whose false-alarm rate stays within the budget. Generalisation: `split_check`
picks the threshold on one half of the series and reports it on the other, and
`leave_one_out` picks it on all series but one and scores that one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.backtest import run as bt
from pipeline.detect.series import (
    HOUR_MS,
    Episodes,
    SeriesParams,
    SeriesState,
    series_score,
)

ZSCORE_WINDOW = 288
EWMA_ALPHA = 0.02
EWMA_WARMUP = 288
DETECTORS = ("fleetpulse", "zscore", "ewma")
THRESHOLDS: dict[str, tuple[float, ...]] = {
    "fleetpulse": tuple(x / 2 for x in range(6, 33)),  # 3 .. 16
    "zscore": tuple(x / 4 for x in range(12, 49)),  # 3 .. 12
    "ewma": tuple(x / 4 for x in range(12, 49)),
}
FA_BUDGETS = (0.5, 1.0, 1.3, 2.0, 2.8)  # false alarms per series-week

# (ts, score, check); score is NaN where the detector has no opinion (warm-up, bad value)
Trace = list[tuple[int, float, str]]


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[int, float]]
    windows: list[tuple[int, int]]


@dataclass(frozen=True)
class Run:
    """One detector at one threshold over every series."""

    detector: str
    threshold: float
    results: list[bt.SeriesResult]

    def summary(self, names: set[str] | None = None) -> bt.Summary:
        return bt.summarise([r for r in self.results if names is None or r.series in names])


# --- scores ----------------------------------------------------------------------------------


def fleetpulse_trace(points: list[tuple[int, float]], params: SeriesParams) -> Trace:
    """Scores of the series detector; the first entry's check carries the sampling step the
    detector settled on ("step=<ms>"), which its episode rule needs."""
    state = SeriesState()
    out = []
    for ts, value in points:
        scored = series_score(state, ts, value, params)
        out.append((ts, math.nan, "") if scored is None else (ts, scored[0], scored[1]))
    if out and state.scorer is not None:
        out[0] = (out[0][0], out[0][1], f"step={state.scorer.step_ms}")
    return out


def zscore_trace(points: list[tuple[int, float]], window: int = ZSCORE_WINDOW) -> Trace:
    """|z| against the mean and sd of the previous `window` valid samples."""
    kept: deque[float] = deque()
    total = total_sq = 0.0
    out = []
    for ts, x in points:
        if not _finite(x):
            out.append((ts, math.nan, ""))
            continue
        z = math.nan
        if len(kept) == window:
            mean = total / window
            sd = math.sqrt(max(total_sq / window - mean * mean, 0.0))
            z = abs(x - mean) / sd if sd > 0 else math.nan
        out.append((ts, z, "zscore"))
        kept.append(x)
        total, total_sq = total + x, total_sq + x * x
        if len(kept) > window:
            old = kept.popleft()
            total, total_sq = total - old, total_sq - old * old
    return out


def ewma_trace(
    points: list[tuple[int, float]], alpha: float = EWMA_ALPHA, warmup: int = EWMA_WARMUP
) -> Trace:
    """|z| against an exponentially weighted mean and variance, after `warmup` samples."""
    mean: float | None = None
    var = 0.0
    seen = 0
    out = []
    for ts, x in points:
        if not _finite(x):
            out.append((ts, math.nan, ""))
            continue
        seen += 1
        z = math.nan
        if mean is not None and seen > warmup and var > 0:
            z = abs(x - mean) / math.sqrt(var)
        out.append((ts, z, "ewma"))
        if mean is None:
            mean = x
            continue
        delta = x - mean
        mean += alpha * delta
        var = (1 - alpha) * (var + alpha * delta * delta)
    return out


def _finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))


# --- flags -----------------------------------------------------------------------------------


def edge_flags(trace: Trace, threshold: float) -> list[tuple[int, float]]:
    """A flag each time the score rises above the threshold."""
    out = []
    above = False
    for ts, score, _ in trace:
        now = score > threshold  # NaN compares False
        if now and not above:
            out.append((ts, score))
        above = now
    return out


def episode_flags(
    trace: Trace, threshold: float, params: SeriesParams
) -> list[tuple[int, float]]:
    """FleetPulse's episode openings at `threshold` (the detector's own episode rule)."""
    head = trace[0][2] if trace else ""
    step = int(head[5:]) if head.startswith("step=") else HOUR_MS
    episodes = Episodes(threshold, max(params.clear_h * HOUR_MS, 3 * step))
    out = []
    for ts, score, check in trace:
        if math.isnan(score):
            continue
        change = episodes.step(ts, score, check)
        if change is not None and change[0]:
            out.append((ts, score))
    return out


def _result(series: Series, flags: list[tuple[int, float]], check: str) -> bt.SeriesResult:
    result = bt.SeriesResult(
        series=series.name,
        points=len(series.points),
        start_ts=series.points[0][0],
        end_ts=series.points[-1][0],
        flags=[bt.Flag(ts=ts, series=series.name, check=check, score=round(score, 3))
               for ts, score in flags],
    )
    bt.score_series(result, series.windows)
    return result


# --- sweeps and comparisons ------------------------------------------------------------------


def sweep(
    data: Sequence[Series],
    params: SeriesParams | None = None,
    thresholds: dict[str, tuple[float, ...]] = THRESHOLDS,
) -> dict[str, list[Run]]:
    """Every detector at every threshold of its sweep, over every series."""
    params = params or SeriesParams()
    traces: dict[str, Callable[[list[tuple[int, float]]], Trace]] = {
        "fleetpulse": lambda pts: fleetpulse_trace(pts, params or SeriesParams()),
        "zscore": zscore_trace,
        "ewma": ewma_trace,
    }
    out: dict[str, list[Run]] = {}
    for detector, trace_of in traces.items():
        per_series = [(s, trace_of(s.points)) for s in data if s.points]
        runs = []
        for threshold in thresholds[detector]:
            results = []
            for series, trace in per_series:
                if detector == "fleetpulse":
                    flags = episode_flags(trace, threshold, params)
                else:
                    flags = edge_flags(trace, threshold)
                results.append(_result(series, flags, detector))
            runs.append(Run(detector, threshold, results))
        out[detector] = runs
    return out


def best_within(runs: Sequence[Run], budget: float, names: set[str] | None = None) -> Run | None:
    """The run with the highest recall whose false alarms per week stay within `budget`
    (ties: fewer false alarms, then the higher threshold)."""
    fitting = [r for r in runs if r.summary(names).false_alarms_per_week <= budget]
    if not fitting:
        return None

    def key(run: Run) -> tuple[float, float, float]:
        s = run.summary(names)
        return (s.recall or 0.0, -s.false_alarms_per_week, run.threshold)

    return max(fitting, key=key)


def at_threshold(runs: Sequence[Run], threshold: float) -> Run:
    return min(runs, key=lambda r: abs(r.threshold - threshold))


def point(run: Run | None, names: set[str] | None = None) -> dict[str, object] | None:
    if run is None:
        return None
    s = run.summary(names)
    return {
        "threshold": run.threshold,
        "recall": None if s.recall is None else round(s.recall, 3),
        "hits": s.hits,
        "windows": s.windows,
        "false_alarms": s.false_alarms,
        "false_alarms_per_week": s.false_alarms_per_week,
        "delay_median_s": s.delay_median_s,
    }


def matched(
    swept: dict[str, list[Run]], budgets: Sequence[float] = FA_BUDGETS
) -> dict[str, dict[str, object]]:
    """Per false-alarm budget, each detector's best recall within it."""
    return {
        f"{budget:g}": {d: point(best_within(runs, budget)) for d, runs in swept.items()}
        for budget in budgets
    }


def curve(runs: Sequence[Run]) -> list[dict[str, object] | None]:
    return [point(r) for r in runs]


def split_check(
    swept: dict[str, list[Run]], split: tuple[set[str], set[str]], budget: float
) -> list[dict[str, object]]:
    """Threshold picked on one half (best recall within `budget` there), scored on the other."""
    out: list[dict[str, object]] = []
    for tune, test in (split, split[::-1]):
        for detector, runs in swept.items():
            chosen = best_within(runs, budget, tune)
            out.append({
                "detector": detector,
                "tuned_on": sorted(tune),
                "tested_on": sorted(test),
                "tuned": point(chosen, tune),
                "tested": point(chosen, test),
            })
    return out


def halves(names: Sequence[str]) -> tuple[set[str], set[str]]:
    """A fixed split, not a chosen one: alternate series in name order."""
    ordered = sorted(names)
    return set(ordered[0::2]), set(ordered[1::2])


def leave_one_out(swept: dict[str, list[Run]], budget: float) -> dict[str, dict[str, object]]:
    """Each series scored at the threshold picked on the others; totals over the series."""
    out: dict[str, dict[str, object]] = {}
    for detector, runs in swept.items():
        names = [r.series for r in runs[0].results]
        hits = windows = alarms = 0
        weeks = 0.0
        chosen: dict[str, float | None] = {}
        for name in names:
            pick = best_within(runs, budget, set(names) - {name})
            chosen[name] = None if pick is None else pick.threshold
            if pick is None:
                continue
            s = pick.summary({name})
            hits, windows = hits + s.hits, windows + s.windows
            alarms, weeks = alarms + s.false_alarms, weeks + s.weeks
        out[detector] = {
            "thresholds": chosen,
            "hits": hits,
            "windows": windows,
            "recall": round(hits / windows, 3) if windows else None,
            "false_alarms": alarms,
            "false_alarms_per_week": round(alarms / weeks, 3) if weeks else None,
        }
    return out
