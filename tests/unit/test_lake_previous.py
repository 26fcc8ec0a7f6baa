"""The lake an earlier release wrote is read by this one: its xid files (the only table whose
columns changed since, xid_event/2 adding `count` and `last_ts`) lack two columns, and their rows
still count as one kernel-log line each beside the current release's rows."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow.parquet as pq

from pipeline.config import LakeSettings
from pipeline.lake.query import Lake
from pipeline.lake.writer import LakeWriter, visible_files
from pipeline.model import XidEvent
from pipeline.wire import codec

PREVIOUS = Path(__file__).resolve().parents[1] / "data" / "previous"
ADDED = ("count", "last_ts")  # the xid table's columns the previous release did not write


def _previous_release_file(root: Path) -> None:
    """The xid_event/1 sample as the previous release's sink stored it: its columns less ADDED."""
    writer = LakeWriter(root, LakeSettings())
    old = codec.decode((PREVIOUS / "xid_event.v1.json").read_bytes(), XidEvent)
    writer.add("xid", old, ("t.events.xid", 0, 0))
    writer.checkpoint()
    (path,) = visible_files(root, "xid")
    table = pq.read_table(path, partitioning=None)
    assert set(ADDED) <= set(table.column_names)
    pq.write_table(table.drop_columns(list(ADDED)), path)


def test_an_earlier_release_lake_reads_beside_the_current_one(tmp_path: Path) -> None:
    _previous_release_file(tmp_path)
    old = codec.decode((PREVIOUS / "xid_event.v1.json").read_bytes(), XidEvent)
    storm = msgspec.structs.replace(old, ts=old.ts + 60_000, count=3, last_ts=old.ts + 65_000)
    writer = LakeWriter(tmp_path, LakeSettings())
    writer.add("xid", storm, ("t.events.xid", 0, 1))
    writer.checkpoint()

    with Lake(tmp_path) as lake:
        rows = lake.sql('SELECT "count", last_ts IS NULL, lines FROM xid ORDER BY ts').rows
        total = lake.sql("SELECT sum(lines) FROM xid").rows[0][0]
        assert not lake.skipped, f"lake files skipped: {lake.skipped}"
    assert rows == [(None, True, 1), (3, False, 3)], f"(count, no last_ts, lines): {rows}"
    assert total == 4
