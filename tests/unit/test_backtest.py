"""Backtest: reading series and labels, NAB window scoring, replay of a JSONL recording."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipeline.backtest import run as bt
from pipeline.config import DetectSettings
from pipeline.detect.series import SeriesParams
from pipeline.wire import codec
from tests.detect_fixture import T0, gpu_sample, xid

HOUR = 3_600_000


def test_parse_time_forms() -> None:
    assert bt.parse_time("2014-02-26 13:45:00") == bt.parse_time("2014-02-26 13:45:00.000000")
    assert bt.parse_time("2014-02-26T13:45:00Z") == bt.parse_time("2014-02-26 13:45:00")
    assert bt.parse_time("1393422300000") == 1_393_422_300_000 == bt.parse_time(1_393_422_300_000)
    assert bt.format_time(bt.parse_time("2014-02-26 13:45:00")) == "2014-02-26 13:45:00"
    with pytest.raises(bt.BacktestError, match="expected"):
        bt.parse_time("yesterday")


def test_read_csv_series(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("timestamp,value\n2014-01-01 00:00:00,1.5\n2014-01-01 00:05:00,oops\n\n")
    points = bt.read_csv_series(path)
    assert points[0] == (bt.parse_time("2014-01-01 00:00:00"), 1.5)
    assert points[1][1] != points[1][1]  # NaN: skipped by the detector, counted there
    (tmp_path / "bad.csv").write_text("time;val\n")
    with pytest.raises(bt.BacktestError, match="header"):
        bt.read_csv_series(tmp_path / "bad.csv")


def test_nab_rule_builds_windows_from_labels() -> None:
    windows = bt.windows_from_labels([T0 + 50 * HOUR], T0, T0 + 100 * HOUR)
    assert windows == [(T0 + 45 * HOUR, T0 + 55 * HOUR)]  # 10 % of the span, centred
    two = bt.windows_from_labels([T0 + HOUR, T0 + 90 * HOUR], T0, T0 + 100 * HOUR)
    assert two == [(T0, T0 + int(3.5 * HOUR)), (T0 + int(87.5 * HOUR), T0 + int(92.5 * HOUR))]


def test_lookup_matches_a_file_path_by_its_suffix() -> None:
    table: dict[str, list[int]] = {"realKnownCause/a.csv": [], "a.csv": [], "other/b.csv": []}
    assert bt.lookup(table, "/data/nab/realKnownCause/a.csv") == "realKnownCause/a.csv"
    assert bt.lookup(table, "/data/b.csv") is None
    assert bt.lookup(table, "a.csv") == "a.csv"


def _series(n: int, shift_at: int | None = None, seed: int = 3) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [
        (T0 + i * 300_000, 50 + rng.gauss(0, 1) + (25 if shift_at and i >= shift_at else 0))
        for i in range(n)
    ]


def test_scoring_hits_false_alarms_and_delay() -> None:
    params = SeriesParams()
    result = bt.run_series("s", _series(2000, shift_at=1500), params)
    shift_ts = T0 + 1500 * 300_000
    windows = [
        (shift_ts - 10 * 300_000, shift_ts + 50 * 300_000),
        (T0 + 600 * 300_000, T0 + 700 * 300_000),
    ]
    bt.score_series(result, windows)
    assert result.hits[0] is not None and result.hits[1] is None
    assert result.false_alarms == sum(f.window is None for f in result.flags)
    summary = bt.summarise([result])
    assert (summary.windows, summary.hits, summary.recall) == (2, 1, 0.5)
    assert summary.delay_median_s == (result.hits[0] - windows[0][0]) / 1000
    assert summary.weeks == pytest.approx(1999 * 300_000 / bt.WEEK_MS, abs=1e-3)


def test_flat_series_with_labels_scores_zero_recall_and_no_false_alarm() -> None:
    result = bt.run_series("s", _series(1000), SeriesParams())
    bt.score_series(result, [(T0, T0 + 10 * 300_000)])
    assert bt.summarise([result]).recall == 0.0
    assert result.false_alarms == 0


def test_replay_of_a_recording_flags_per_target(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    lines = [codec.encode(gpu_sample(step)) for step in range(30)]
    lines.append(codec.encode(xid(79, 295)))
    lines.append(b"{not json")
    path.write_bytes(b"\n".join(lines) + b"\n")
    results, stats = bt.run_recording(path, DetectSettings())
    assert [r.series for r in results] == ["n1"]
    assert [(f.check, f.device, f.action) for f in results[0].flags] == [("xid.79", "0", "reboot")]
    assert (stats.records, stats.bad_lines, stats.findings) == (31, 1, 1)
    assert stats.heartbeats == 5
    assert results[0].points == 31
