"""One damaged file in the lake is quarantined, not fatal.

Each scenario damages one committed utilization file of a lake written by the real writer (the
fixture fleet of tests/lake_fixture.py, in batches, so partitions hold several files), then runs
the real commands in their own processes: `sql "select 1"` and count queries, `report`,
`lake status`, `lake compact`. Every command exits 0, names the bad file, and every row of every
readable file is counted exactly once, before and after compaction. Figures are recorded for
the README's Reliability table (tests/faults/reliability.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config import LakeSettings
from pipeline.lake.check import QUARANTINE_DIR
from pipeline.lake.writer import LakeWriter, visible_files
from tests import lake_fixture as fx
from tests.faults import reliability

ROOT = Path(__file__).resolve().parents[2]
BATCH = 100  # events per committed flush: six utilization files per hour partition
# every value of every row is read (a bare count(*) is answered from the footers alone)
COUNTS = " UNION ALL ".join(
    f"SELECT '{table}' AS tbl, count(to_json(t)) AS n FROM raw_{table} t"
    for table in fx.EVERYTHING
)


def batched_lake(root: Path) -> Path:
    writer = LakeWriter(root, LakeSettings())
    for table, events in fx.EVERYTHING.items():
        for offset, event in enumerate(events()):
            writer.add(table, event, (f"t.{table}", 0, offset))
            if (offset + 1) % BATCH == 0:
                writer.checkpoint()
    writer.checkpoint()
    return root


def fleetpulse(lake: Path, *args: str, extra: tuple[str, ...] = ()
               ) -> subprocess.CompletedProcess[str]:
    """The real command in its own process; it must exit 0 and never print a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           # merge any two files and delete what they held at once, to check every row
           "FLEETPULSE_LAKE__COMPACT_MIN_FILES": "2", "FLEETPULSE_LAKE__COMPACT_KEEP_S": "0"}
    command = [sys.executable, "-m", "pipeline.cli", *args, "--lake", str(lake), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False,
                          cwd=lake.parent, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done


def counts(lake: Path) -> tuple[dict[str, int], str]:
    """Rows per table, and what the command said on stderr."""
    done = fleetpulse(lake, "sql", COUNTS, extra=("--format", "csv"))
    lines = done.stdout.splitlines()[1:]
    return {table: int(n) for table, n in (line.split(",") for line in lines)}, done.stderr


@pytest.mark.parametrize(
    "how",  # one kind of damage in make test, every kind in make faults
    [
        "truncated",
        *(pytest.param(how, marks=pytest.mark.slow) for how in ("corrupt", "zero-byte", "damaged pages")),
    ],
)
def test_a_damaged_lake_file_is_skipped_then_quarantined_and_no_good_row_is_lost(
    tmp_path: Path, how: str
) -> None:
    lake = batched_lake(tmp_path / "lake")
    files = visible_files(lake, "utilization")
    bad = files[len(files) // 3]
    expected = {table: len(events()) for table, events in fx.EVERYTHING.items()}
    expected["utilization"] -= pq.read_metadata(bad).num_rows
    rows_good = sum(expected.values())
    fx.damage(bad, how)

    one = fleetpulse(lake, "sql", "select 1", extra=("--format", "csv"))
    assert one.stdout.splitlines()[1:] == ["1"]
    if how != "damaged pages":  # the cheap check sees the others before any query runs
        assert str(bad) in one.stderr and "skipped unreadable lake file" in one.stderr
    # damaged pages show only when read: the failed read sends the reader looking for the file
    answered, said = counts(lake)
    assert answered == expected
    assert f"skipped unreadable lake file {bad}" in said

    report = tmp_path / "report.html"
    made = fleetpulse(lake, "report", "--out", str(report))
    assert "1 unreadable lake files skipped" in made.stderr
    html = report.read_text()
    assert 'data-table="skipped-files"' in html and bad.name in html

    verify = ("--verify",) if how == "damaged pages" else ()
    status = fleetpulse(lake, "lake", "status", extra=verify).stdout
    assert str(bad.relative_to(lake)) in status.split("unreadable, skipped by readers")[1]

    compacted = fleetpulse(lake, "lake", "compact", extra=verify)
    assert "quarantined 1 unreadable files" in compacted.stdout
    assert str(bad.relative_to(lake)) in compacted.stderr
    moved = lake / QUARANTINE_DIR / bad.relative_to(lake)
    assert moved.is_file() and not bad.exists()
    merged = int(compacted.stdout.split("merged ")[1].split(" files")[0])
    assert merged > 0, "the rest of the lake was compacted"

    after = fleetpulse(lake, "lake", "status").stdout
    assert "unreadable" not in after and str(moved.relative_to(lake / QUARANTINE_DIR)) in after
    final, said = counts(lake)
    clean = fleetpulse(lake, "sql", "select 1")
    assert "skipped" not in clean.stderr + said, "a quarantined file is never read"
    lost = rows_good - sum(final.values())
    assert final == expected and lost == 0
    reliability.record("lake", how, {
        "files_bad": 1,
        "quarantined": len(list((lake / QUARANTINE_DIR).rglob("*.parquet"))),
        "rows_good": rows_good,
        "rows_answered": sum(answered.values()),
        "rows_after_compact": sum(final.values()),
        "lost": lost,
    })
