"""`fleetpulse demo` end to end, as a user runs it (small fleet so it stays quick)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.model import Action
from pipeline.wire import codec


def _demo(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipeline.cli", "demo", "--out", str(out),
               "--gpu-nodes", "12", "--tpu-slices", "1", "--hours", "0.5", "--intensity", "2000", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"})


def test_demo_writes_lake_actions_report_and_a_scored_summary(tmp_path: Path) -> None:
    run = _demo(tmp_path / "demo", "--inject", "G1@300", "--inject", "G5@600")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for words in ("Injected faults and what FleetPulse found", "Decisions", "Precision", "Try next"):
        assert words in out, out
    lake = tmp_path / "demo" / "lake"
    assert list((lake / "utilization").rglob("*.parquet")), "no utilization files"
    assert list((lake / "node_state").rglob("*.parquet")), "no node-state files"
    actions = [codec.decode(line, Action) for line in (tmp_path / "demo" / "actions.jsonl").read_bytes().splitlines()]
    assert actions, "a boosted run must act on something"
    assert len({a.action_id for a in actions}) == len(actions), "action ids repeat"
    report = (tmp_path / "demo" / "report.html").read_text()
    assert report.startswith("<!DOCTYPE html>") or report.lower().startswith("<!doctype html>")
    # the capacity stage's snapshots (fleet.capacity) are in the lake, and what people see
    assert list((lake / "capacity_snapshots").rglob("*.parquet")), "no capacity snapshots"
    assert '<p data-source="snapshots">' in report
    shown = subprocess.run([sys.executable, "-m", "pipeline.cli", "capacity", "--lake", str(lake)],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "Capacity from the capacity stage's snapshots" in shown.stdout


def test_same_seed_same_actions(tmp_path: Path) -> None:
    first = _demo(tmp_path / "a", "--no-report", "--seed", "11")
    second = _demo(tmp_path / "b", "--no-report", "--seed", "11")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert (tmp_path / "a" / "actions.jsonl").read_bytes() == (tmp_path / "b" / "actions.jsonl").read_bytes()


def test_a_bad_fault_spec_is_a_clear_error(tmp_path: Path) -> None:
    run = _demo(tmp_path / "bad", "--inject", "G1-at-noon")
    assert run.returncode == 2
    assert "expected TYPE[/VARIANT]@SECONDS" in run.stderr


def test_help_describes_the_demo() -> None:
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "demo", "--help"],
                         capture_output=True, text=True, check=True)
    assert "--gpu-nodes" in run.stdout and "no Kafka" in run.stdout.replace("\n", " ")


def test_piped_output_keeps_commands_whole_and_leaves_no_blank_progress_lines(tmp_path: Path) -> None:
    # stdout is a pipe (no TTY) and no COLUMNS: rich would assume 80 columns and wrap
    out = tmp_path / "a-folder-name-long-enough" / "that-every-suggested-command-passes-80-columns"
    command = [sys.executable, "-m", "pipeline.cli", "demo", "--out", str(out), "--gpu-nodes", "4",
               "--tpu-slices", "1", "--hours", "0.1", "--no-report"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    lake = out / "lake"
    for suggested in (f"sql --lake {lake} --query top_offenders",
                      f'sql --lake {lake} "select kind, count(*) from actions group by 1"',
                      f"report --lake {lake} --out fleet.html"):
        assert any(line.endswith(suggested) for line in lines), run.stdout
    # the header, then the one blank line the summary starts with: nothing left by a progress bar
    assert lines[0].startswith("FleetPulse demo:") and lines[0].endswith("seed 7")
    assert lines[1] == "" and lines[2].startswith("Processed "), run.stdout[:500]
    assert run.stderr == ""


def test_a_second_run_into_the_same_folder_keeps_nothing_of_the_first(tmp_path: Path) -> None:
    """A shorter run wrote fewer lake files (and fewer hour partitions) and left the longer
    one's beyond them: the lake and report mixed two runs."""
    out = tmp_path / "demo"
    small = ("--gpu-nodes", "4", "--tpu-slices", "1", "--no-report")
    assert _demo(out, *small, "--hours", "1.2").returncode == 0  # into hour=01 too
    second = _demo(out, *small, "--hours", "0.1")
    assert second.returncode == 0, second.stderr
    latest = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sql", "--lake", str(out / "lake"), "--format",
         "csv", "SELECT max(window_start + to_seconds(window_s)) FROM utilization"],
        capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()[1]  # fmt: skip
    assert latest <= "2026-01-01 00:06:00", latest  # the 0.1 h run alone
    assert not list((out / "lake").rglob("hour=01"))


def test_a_folder_with_a_lake_the_demo_did_not_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mine" / "lake" / "utilization").mkdir(parents=True)
    run = _demo(tmp_path / "mine", "--no-report")
    assert run.returncode == 2
    assert "holds a lake that `fleetpulse demo` did not write" in run.stderr
    assert (tmp_path / "mine" / "lake" / "utilization").is_dir()
