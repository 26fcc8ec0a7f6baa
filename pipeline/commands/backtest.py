"""`fleetpulse backtest FILE...`: what the detectors would have flagged in history, and when.

A `.csv` file (`timestamp,value`, NAB format) runs through the single-series detector; a
`.jsonl` recording of topic values (one encoded event per line, as the simulator records
them) replays through the telemetry stage (the GPU, XID, fabric, TPU and ICI detectors, as the
stream runs them). With labelled windows it scores them: window recall, false alarms per
series-week and detection delay from window start.
`--compare` sweeps the series detector and two plain baselines (rolling z-score, EWMA) over
their thresholds and compares their recall at matched false-alarm rates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import msgspec

from pipeline.backtest import run as bt
from pipeline.backtest import sweep as sw
from pipeline.config import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "backtest",
        help="run the detectors over history and score them against labels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="timestamp,value CSV files (a directory: every CSV below it) or JSONL recordings",
    )
    parser.add_argument(
        "--windows", type=Path, help="NAB windows.json: {series: [[start, end], ...]}"
    )
    parser.add_argument(
        "--labels",
        type=Path,
        help="NAB labels.json: {series: [timestamp, ...]}; used for windows (NAB's 10 %% rule) "
        "when --windows does not name a series",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="CSV series with windows: sweep the series detector, a rolling z-score (288 "
        "samples) and an EWMA (alpha 0.02) over their thresholds and print each one's best "
        "recall at matched false alarms per series-week, with a leave-one-series-out check",
    )
    parser.add_argument(
        "--sensitivity",
        type=float,
        help="the series detector's sensitivity (default [detect] series_sensitivity)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    windows = bt.read_windows(args.windows) if args.windows else {}
    labels = bt.read_labels(args.labels) if args.labels else {}
    labelled = bool(args.windows or args.labels)
    if args.sensitivity is not None:
        if args.sensitivity <= 0:
            raise bt.BacktestError(f"--sensitivity: expected a number > 0, got {args.sensitivity}")
        detect = msgspec.structs.replace(settings.detect, series_sensitivity=args.sensitivity)
        settings = msgspec.structs.replace(settings, detect=detect)
    if args.compare:
        return _compare(args, settings, windows, labels)
    results: list[bt.SeriesResult] = []
    recordings: list[bt.Recording] = []
    for path in _inputs(args.files):
        if path.suffix == ".jsonl":
            found, stats = bt.run_recording(path, settings.detect, settings.kafka.max_value_bytes)
            results.extend(found)
            recordings.append(stats)
        else:
            points = bt.read_csv_series(path)
            results.append(bt.run_series(str(path), points, bt.params_for(settings.detect)))
    if labelled:
        for result in results:
            bt.score_series(result, _windows_for(result, windows, labels))
    summary = bt.summarise(results) if labelled else None
    if args.json:
        print(json.dumps(_document(results, recordings, summary), indent=1))
    else:
        _print_text(results, recordings, summary)
    return 0


def _compare(
    args: argparse.Namespace,
    settings: Settings,
    windows: dict[str, list[tuple[int, int]]],
    labels: dict[str, list[int]],
) -> int:
    if not (args.windows or args.labels):
        raise bt.BacktestError("--compare needs --windows or --labels")
    data = []
    for path in _inputs(args.files):
        if path.suffix == ".jsonl":
            raise bt.BacktestError(f"--compare reads CSV series, got a recording: {path}")
        points = bt.read_csv_series(path)
        if not points:
            continue
        probe = bt.SeriesResult(series=str(path), points=len(points), start_ts=points[0][0],
                                end_ts=points[-1][0])
        data.append(sw.Series(str(path), points, _windows_for(probe, windows, labels)))
    swept = sw.sweep(data, bt.params_for(settings.detect))
    matched = sw.matched(swept)
    loo = sw.leave_one_out(swept, 1.3) if len(data) > 1 else {}
    if args.json:
        print(json.dumps({"matched": matched, "leave_one_out": loo}, indent=1))
        return 0
    print(f"{len(data)} series; best recall (threshold, false alarms/week) within each budget")
    print("FA/week budget  " + "  ".join(f"{d:>24}" for d in sw.DETECTORS))
    for budget, row in matched.items():
        cells = []
        for detector in sw.DETECTORS:
            cell = row[detector]
            if not isinstance(cell, dict):
                cells.append(f"{'-':>24}")
                continue
            text = f"{cell['recall']} ({cell['threshold']:g}, {cell['false_alarms_per_week']:.2f})"
            cells.append(f"{text:>24}")
        print(f"{'<= ' + budget:>14}  " + "  ".join(cells))
    for detector, part in loo.items():
        print(f"leave one series out, {detector}: recall {part['recall']} "
              f"({part['hits']}/{part['windows']}), {part['false_alarms_per_week']} false "
              "alarms/week at ≤ 1.3 picked on the other series")
    return 0


def _inputs(files: list[Path]) -> list[Path]:
    inputs: list[Path] = []
    for path in files:
        if path.is_dir():
            inputs.extend(bt.csv_files([path]))
        elif not path.exists():
            raise bt.BacktestError(f"{path} does not exist")
        else:
            inputs.append(path)
    return inputs


def _windows_for(
    result: bt.SeriesResult,
    windows: dict[str, list[tuple[int, int]]],
    labels: dict[str, list[int]],
) -> list[tuple[int, int]]:
    key = bt.lookup(windows, result.series)
    if key is not None:
        return windows[key]
    key = bt.lookup(labels, result.series)
    if key is not None:
        return bt.windows_from_labels(labels[key], result.start_ts, result.end_ts)
    return []


def _iso(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _document(
    results: list[bt.SeriesResult], recordings: list[bt.Recording], summary: bt.Summary | None
) -> dict[str, Any]:
    flags = [
        {
            "timestamp": _iso(flag.ts),
            "ts": flag.ts,
            "series": flag.series,
            "check": flag.check,
            "score": flag.score,
            "value": flag.value,
            "baseline": flag.baseline,
            "severity": flag.severity,
            "action": flag.action,
            "device": flag.device,
            "window": flag.window,
        }
        for result in results
        for flag in result.flags
    ]
    series = [
        {
            "series": r.series,
            "points": r.points,
            "start": _iso(r.start_ts),
            "end": _iso(r.end_ts),
            "weeks": round(r.weeks, 3),
            "flags": len(r.flags),
            "dropped": r.dropped,
            "windows": [[_iso(a), _iso(b)] for a, b in r.windows],
            "hits": [None if hit is None else _iso(hit) for hit in r.hits],
            "false_alarms": r.false_alarms,
        }
        for r in results
    ]
    return {
        "series": series,
        "flags": flags,
        "recordings": [
            {field: getattr(rec, field) for field in rec.__struct_fields__} for rec in recordings
        ],
        "summary": None
        if summary is None
        else {field: getattr(summary, field) for field in summary.__struct_fields__},
    }


def _print_text(
    results: list[bt.SeriesResult], recordings: list[bt.Recording], summary: bt.Summary | None
) -> None:
    for result in results:
        print(
            f"{result.series}: {result.points} points, {bt.format_time(result.start_ts)} .. "
            f"{bt.format_time(result.end_ts)} ({result.weeks:.1f} weeks), "
            f"{len(result.flags)} flags"
        )
        for flag in result.flags:
            print("  " + _flag_line(result, flag, summary is not None))
        if summary is not None:
            hits = sum(hit is not None for hit in result.hits)
            print(f"  windows hit {hits}/{len(result.windows)}, false alarms {result.false_alarms}")
    for rec in recordings:
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(rec.bad_reasons.items()))
        print(
            f"recording: {rec.records} records, {rec.bad_lines} undecodable lines"
            + (f" ({reasons})" if reasons else "")
            + ", "
            f"{rec.findings} findings, {rec.clears} clears, {rec.heartbeats} heartbeats"
            + (f"; first bad line {rec.first_bad}" if rec.first_bad else "")
        )
    if summary is None:
        print(f"{sum(len(r.flags) for r in results)} flags in {len(results)} series")
        return
    recall = "-" if summary.recall is None else f"{summary.recall:.3f}"
    print(
        f"summary: {summary.series} series, windows hit {summary.hits}/{summary.windows} "
        f"(recall {recall}), false alarms {summary.false_alarms} "
        f"({summary.false_alarms_per_week:.2f} per series-week over {summary.weeks:.1f} weeks), "
        f"delay from window start median {_duration(summary.delay_median_s)} "
        f"mean {_duration(summary.delay_mean_s)}"
    )


def _flag_line(result: bt.SeriesResult, flag: bt.Flag, scored: bool) -> str:
    parts = [bt.format_time(flag.ts), flag.check]
    if flag.device is not None:
        parts.append(f"device={flag.device}")
    if flag.score is not None:
        parts.append(f"score={flag.score:g}")
    if flag.value is not None:
        parts.append(f"value={flag.value:g}")
    if flag.baseline is not None:
        parts.append(f"baseline={flag.baseline:g}")
    if flag.action != "watch" or flag.severity != "warning":
        parts.append(f"{flag.severity}/{flag.action}")
    if scored:
        if flag.window is None:
            parts.append("FALSE ALARM")
        else:
            start = result.windows[flag.window][0]
            parts.append(f"in window {flag.window + 1} (+{_duration((flag.ts - start) / 1000)})")
    return "  ".join(parts)
