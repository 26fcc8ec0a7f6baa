"""Compaction keeps every row exactly once, touches only committed files, and is safe to run
while a writer keeps writing and readers keep reading."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.config import LakeSettings
from pipeline.lake.compact import compact
from pipeline.lake.query import Lake, QueryError
from pipeline.lake.tables import UTILIZATION
from pipeline.lake.writer import LakeWriter, files_in, partition_dirs, visible_files
from pipeline.model import Utilization
from tests import lake_fixture as fx

SETTINGS = LakeSettings(compact_min_files=2, compact_keep_s=0)
# merged files kept for a while, as in production: readers that listed them can still read them
KEEPING = LakeSettings(compact_min_files=2)
ORDER = ["window_start", "node", "device"]


def write_in_batches(root: Path, rows: list[Utilization], batch: int, commit_upto: int) -> None:
    """Rows to two partitions in batches; batches ending at or before commit_upto are committed."""
    writer = LakeWriter(root, SETTINGS)
    for start in range(0, len(rows), batch):
        for offset in range(start, min(start + batch, len(rows))):
            writer.add("utilization", rows[offset], ("fleet.utilization", offset % 2, offset))
        positions = writer.flush()
        if start + batch <= commit_upto:
            writer.mark_committed(positions)


def table_content(root: Path) -> list[dict[str, object]]:
    table = pq.read_table(visible_files(root, "utilization"), partitioning=None)
    return table.sort_by([(c, "ascending") for c in ORDER]).to_pylist()


def test_compaction_preserves_rows_and_content_and_skips_uncommitted_files(tmp_path: Path) -> None:
    rows = fx.utilization()
    write_in_batches(tmp_path, rows, batch=100, commit_upto=2000)
    before = table_content(tmp_path)
    files_before = len(visible_files(tmp_path, "utilization"))

    report = compact(tmp_path, SETTINGS)

    assert table_content(tmp_path) == before
    assert len(before) == len(rows)
    after = [parse for d in partition_dirs(tmp_path, "utilization") for parse in files_in(d)]
    assert report.files_merged > 0 and len(after) < files_before
    # every file above the committed offset (2000) is still the sink's own, never merged
    assert all(not f.compacted for f in after if f.first >= 2000)
    assert all(f.last < 2000 for f in after if f.compacted)
    # the merged files hold exactly what the report says and the directory has no leftovers
    assert report.rows == sum(pq.ParquetFile(f.path).metadata.num_rows for f in after if f.compacted)
    assert sum(len(os.listdir(d)) for d in partition_dirs(tmp_path, "utilization")) == len(after)


def test_compacting_again_merges_compacted_files_with_new_ones(tmp_path: Path) -> None:
    rows = fx.utilization()
    write_in_batches(tmp_path, rows, batch=150, commit_upto=1200)
    compact(tmp_path, SETTINGS)
    write_in_batches(tmp_path, rows, batch=150, commit_upto=len(rows))  # replay and commit all
    before = table_content(tmp_path)
    compact(tmp_path, SETTINGS)
    assert table_content(tmp_path) == before and len(before) == len(rows)
    again = compact(tmp_path, SETTINGS)
    assert again.files_merged == 0, "a compacted lake has nothing more to merge"


def test_compaction_is_safe_while_a_writer_writes_and_a_reader_reads(tmp_path: Path) -> None:
    rows = fx.utilization()
    # rows known to be in files (floor) and rows that may already be (ceiling)
    written = {"floor": 0, "ceiling": 0}
    problems: list[str] = []
    done = threading.Event()

    def writer() -> None:
        lake_writer = LakeWriter(tmp_path, SETTINGS)
        for start in range(0, len(rows), 40):
            end = min(start + 40, len(rows))
            for offset in range(start, end):
                lake_writer.add("utilization", rows[offset], ("fleet.utilization", 0, offset))
            written["ceiling"] = end
            lake_writer.mark_committed(lake_writer.flush())
            written["floor"] = end
        done.set()

    def reader() -> None:
        while not done.is_set():
            floor = written["floor"]
            try:
                with Lake(tmp_path) as lake:
                    total, distinct = lake.sql(
                        "SELECT count(*), count(DISTINCT (node, device, window_start)) "
                        "FROM utilization"
                    ).rows[0]
            except QueryError as exc:
                problems.append(str(exc))
                continue
            ceiling = written["ceiling"]
            if total != distinct or not floor <= total <= ceiling:
                problems.append(f"saw {total} rows ({distinct} distinct), written {floor}-{ceiling}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    merged = 0
    while not done.is_set():
        merged += compact(tmp_path, KEEPING).files_merged
        time.sleep(0.01)
    for thread in threads:
        thread.join()
    compact(tmp_path, SETTINGS)
    assert problems == []
    assert merged > 0, "compaction never ran while the writer was writing"
    expected = UTILIZATION.to_arrow(rows).sort_by([(c, "ascending") for c in ORDER]).to_pylist()
    assert table_content(tmp_path) == expected


def test_merged_files_are_kept_for_a_while_but_never_read(tmp_path: Path) -> None:
    rows = fx.utilization()
    write_in_batches(tmp_path, rows, batch=100, commit_upto=len(rows))
    before = table_content(tmp_path)
    on_disk = sum(len(os.listdir(d)) for d in partition_dirs(tmp_path, "utilization"))
    report = compact(tmp_path, KEEPING)
    assert report.files_merged > 0 and report.superseded_removed == 0
    assert table_content(tmp_path) == before  # the kept files are invisible to readers
    kept = sum(len(os.listdir(d)) for d in partition_dirs(tmp_path, "utilization"))
    assert kept == on_disk + report.files_written
    later = compact(tmp_path, SETTINGS)  # their time is up
    assert later.superseded_removed == report.files_merged and later.files_merged == 0
    assert table_content(tmp_path) == before
