"""`fleetpulse demo` end to end, as a user runs it (small fleet so it stays quick)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline import codec
from pipeline.model import Action


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
