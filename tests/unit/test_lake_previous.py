"""The lake an earlier release wrote is read by this one: its xid files (xid_event/2 added
`count` and `last_ts`) lack two columns, and their rows still count as one kernel-log line each
beside the current release's rows; its utilization files (utilization/2 added `step_compute_s`)
lack the step time, read as none."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow.parquet as pq

from pipeline.config import LakeSettings
from pipeline.lake.query import Lake
from pipeline.lake.writer import LakeWriter, visible_files
from pipeline.model import Utilization, XidEvent
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


def test_utilization_files_without_step_times_read_as_no_step_time(tmp_path: Path) -> None:
    # utilization/2 added step_compute_s: the previous release's files lack the column
    old = codec.decode((PREVIOUS / "utilization.v1.json").read_bytes(), Utilization)
    writer = LakeWriter(tmp_path, LakeSettings())
    writer.add("utilization", old, ("t.utilization", 0, 0))
    writer.checkpoint()
    (path,) = visible_files(tmp_path, "utilization")
    pq.write_table(pq.read_table(path, partitioning=None).drop_columns(["step_compute_s"]), path)
    stepped = msgspec.structs.replace(old, window_start=old.window_start + 60_000,
                                      step_compute_s=0.5)  # fmt: skip
    writer = LakeWriter(tmp_path, LakeSettings())
    writer.add("utilization", stepped, ("t.utilization", 0, 1))
    writer.checkpoint()

    with Lake(tmp_path) as lake:
        rows = lake.sql("SELECT step_compute_s FROM utilization ORDER BY window_start").rows
        (roi,) = lake.run("accelerator_roi", since=None, until=None).records()
        assert not lake.skipped, f"lake files skipped: {lake.skipped}"
    assert rows == [(None,), (0.5,)]
    assert roi["step_s"] == 0.5  # the rows with a step time only
