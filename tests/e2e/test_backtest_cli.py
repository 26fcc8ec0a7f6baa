"""`fleetpulse backtest` end to end: the real command in its own process, on a NAB series and on
a recorded JSONL of topic values."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.wire import codec
from tests.detect_fixture import gpu_sample, xid

NAB = Path("/work/shared/datasets/nab-machine-dev")
SERIES = "realKnownCause/machine_temperature_system_failure.csv"


def backtest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fleetpulse", path=str(Path(sys.executable).parent))
    command = [exe] if exe else [sys.executable, "-m", "pipeline.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_")}
    return subprocess.run(
        [*command, "backtest", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
    )


def _nab_copy(tmp_path: Path) -> Path:
    """The series and its labels; the shared copy when present, else a synthetic stand-in with
    a labelled level drop (so the test runs anywhere)."""
    if (NAB / SERIES).exists():
        return NAB
    root = tmp_path / "nab"
    (root / "realKnownCause").mkdir(parents=True)
    rows = ["timestamp,value"]
    for i in range(6000):
        minutes = i * 5
        value = 80.0 + (i % 7) * 0.3 - (30.0 if 5000 <= i < 5100 else 0.0)
        rows.append(
            f"2014-01-{1 + minutes // 1440:02d} {minutes % 1440 // 60:02d}:{minutes % 60:02d}:00,{value}"
        )
    (root / SERIES).write_text("\n".join(rows) + "\n")
    window = [rows[4990].split(",")[0], rows[5060].split(",")[0]]
    (root / "windows.json").write_text(json.dumps({SERIES: [window]}))
    return root


def test_nab_series_json_flags_and_a_detected_window(tmp_path: Path) -> None:
    root = _nab_copy(tmp_path)
    done = backtest(
        str(root / SERIES), "--windows", str(root / "windows.json"), "--json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"series", "flags", "recordings", "summary"}
    (series,) = report["series"]
    assert series["series"].endswith(SERIES) and series["points"] > 1000
    assert any(hit is not None for hit in series["hits"])  # a labelled window is detected
    assert report["flags"], "flags are listed one by one"
    flag = report["flags"][0]
    assert {"timestamp", "ts", "series", "score", "check"} <= set(flag)
    assert flag["check"].startswith("series.") and flag["timestamp"].endswith("Z")
    summary = report["summary"]
    assert summary["windows"] == len(series["windows"]) and 0 < summary["recall"] <= 1
    assert summary["false_alarms"] == series["false_alarms"]


def test_text_report_and_a_directory_of_series(tmp_path: Path) -> None:
    root = _nab_copy(tmp_path)
    done = backtest(str(root), "--windows", str(root / "windows.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "summary:" in done.stdout and "recall" in done.stdout
    assert "per series-week" in done.stdout


def test_recorded_topic_values_replay_through_the_device_detectors(tmp_path: Path) -> None:
    recording = tmp_path / "sim.jsonl"
    events = [gpu_sample(step) for step in range(30)] + [xid(48, 295, gpu=2)]
    recording.write_bytes(b"".join(codec.encode(e) + b"\n" for e in events))
    done = backtest(str(recording), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(f["series"], f["check"], f["device"]) for f in report["flags"]] == [
        ("n1", "xid.48", "2")
    ]
    assert report["recordings"][0]["records"] == 31 and report["summary"] is None


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    done = backtest(str(tmp_path / "nope.csv"), cwd=tmp_path)
    assert done.returncode == 2
    assert "does not exist" in done.stderr


def _synthetic(root: Path, name: str, drop_at: int, n: int = 3000) -> list[str]:
    """A 5-minute series with a labelled level drop; returns its window."""
    rows = ["timestamp,value"]
    for i in range(n):
        minutes = i * 5
        value = 80.0 + (i * 7919 % 11) * 0.3 - (30.0 if drop_at <= i < drop_at + 100 else 0.0)
        rows.append(
            f"2014-01-{1 + minutes // 1440:02d} {minutes % 1440 // 60:02d}:{minutes % 60:02d}:00,{value}"
        )
    (root / name).write_text("\n".join(rows) + "\n")
    return [rows[drop_at - 10].split(",")[0], rows[drop_at + 60].split(",")[0]]


def test_compare_sweeps_the_detector_and_both_baselines_at_matched_false_alarms(
    tmp_path: Path,
) -> None:
    root = tmp_path / "series"
    root.mkdir()
    windows = {"a.csv": [_synthetic(root, "a.csv", 2000)], "b.csv": [_synthetic(root, "b.csv", 2500)]}
    (root / "windows.json").write_text(json.dumps(windows))
    done = backtest(str(root), "--windows", str(root / "windows.json"), "--compare", "--json",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["matched"]) == {"0.5", "1", "1.3", "2", "2.8"}
    for row in report["matched"].values():
        assert set(row) == {"fleetpulse", "zscore", "ewma"}
    ours = report["matched"]["1.3"]["fleetpulse"]
    assert ours["recall"] == 1.0 and ours["false_alarms_per_week"] <= 1.3
    assert set(report["leave_one_out"]) == {"fleetpulse", "zscore", "ewma"}
    text = backtest(str(root), "--windows", str(root / "windows.json"), "--compare",
                    "--sensitivity", "5", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "leave one series out, fleetpulse" in text.stdout


def test_compare_needs_windows_and_a_positive_sensitivity(tmp_path: Path) -> None:
    root = tmp_path / "series"
    root.mkdir()
    _synthetic(root, "a.csv", 50, n=200)
    done = backtest(str(root), "--compare", cwd=tmp_path)
    assert done.returncode == 2 and "--compare needs --windows" in done.stderr
    done = backtest(str(root), "--sensitivity", "0", cwd=tmp_path)
    assert done.returncode == 2 and "expected a number > 0" in done.stderr
