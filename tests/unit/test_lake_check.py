"""The lake check finds unreadable Parquet files cheaply; readers skip them, compaction
quarantines them, and no row of a readable file is lost or counted twice."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config import LakeSettings
from pipeline.lake.check import (
    QUARANTINE_DIR,
    UnreadableFileError,
    check_dir,
    check_file,
    quarantine,
    quarantined_files,
    read_checked,
    readable_files,
)
from pipeline.lake.compact import compact
from pipeline.lake.query import Lake
from pipeline.lake.writer import LakeWriter, files_in, partition_dirs, visible_files
from tests import lake_fixture as fx

MERGE_NOW = LakeSettings(compact_min_files=2, compact_keep_s=0)
KEEPING = LakeSettings(compact_min_files=2)  # merged files kept for compact_keep_s


def batched_lake(root: Path, batch: int = 100) -> Path:
    """The fixture's utilization, committed in batches: several files per hour partition."""
    writer = LakeWriter(root, LakeSettings())
    for offset, row in enumerate(fx.utilization()):
        writer.add("utilization", row, ("t.utilization", 0, offset))
        if (offset + 1) % batch == 0:
            writer.checkpoint()
    writer.checkpoint()
    return root


def rows_of(paths: list[Path]) -> int:
    return sum(pq.read_metadata(path).num_rows for path in paths)


def count(root: Path) -> int:
    with Lake(root) as lake:
        return int(lake.sql("SELECT count(*) FROM raw_utilization").rows[0][0])


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return batched_lake(tmp_path)


def a_middle_file(root: Path) -> Path:
    return visible_files(root, "utilization")[8]


@pytest.mark.parametrize(("how", "why"), [
    ("zero-byte", "empty file (0 bytes)"),
    ("corrupt", "no 'PAR1' magic at the start"),
    ("truncated", "no 'PAR1' magic at the end"),
])
def test_the_cheap_check_names_what_is_wrong(lake: Path, how: str, why: str) -> None:
    path = a_middle_file(lake)
    fx.damage(path, how)
    reason = check_file(path)
    assert reason is not None and why in reason
    assert check_file(visible_files(lake, "utilization")[0]) is None


def test_a_damaged_footer_or_a_tiny_file_is_caught_without_reading_pages(lake: Path) -> None:
    path = a_middle_file(lake)
    data = path.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    # magic intact at both ends, footer bytes scrambled
    path.write_bytes(data[: -8 - footer] + bytes(b ^ 0xFF for b in data[-8 - footer:-8])
                     + data[-8:])
    assert (check_file(path) or "").startswith("damaged footer")
    path.write_bytes(b"PAR1" + data[-8:])
    assert "footer claims" in (check_file(path) or "")
    path.write_bytes(b"PAR1PAR1")
    assert check_file(path) == "too small to be Parquet (8 bytes)"


def test_damaged_pages_pass_the_cheap_check_and_fail_the_deep_one(lake: Path) -> None:
    path = a_middle_file(lake)
    fx.damage(path, "damaged pages")
    assert check_file(path) is None
    reason = check_file(path, deep=True)
    assert reason is not None and reason.startswith("damaged data")
    assert check_file(path) == reason, "the deep verdict is kept for later cheap checks"
    with pytest.raises(UnreadableFileError, match=str(path.name)):
        read_checked(path)


def test_a_replaced_file_is_checked_again(lake: Path) -> None:
    path = a_middle_file(lake)
    good = path.read_bytes()
    fx.damage(path, "zero-byte")
    assert check_file(path) is not None
    tmp = path.with_name(".replacement.tmp")
    tmp.write_bytes(good)
    os.replace(tmp, path)  # as the sink does on a replay
    assert check_file(path) is None


def test_readers_skip_bad_files_and_count_the_rest(lake: Path) -> None:
    total = rows_of(visible_files(lake, "utilization"))
    bad = a_middle_file(lake)
    bad_rows = rows_of([bad])
    fx.damage(bad, "truncated")
    good, broken = readable_files(lake, "utilization")
    assert [b.path for b in broken] == [bad] and bad not in good
    with Lake(lake) as reader:
        assert reader.sql("SELECT 1").rows == [(1,)]
        assert reader.sql("SELECT count(*) FROM utilization").rows[0][0] == total - bad_rows
        assert list(reader.skipped) == [bad]


def test_a_query_that_hits_damaged_pages_finds_the_file_and_answers_over_the_rest(
    lake: Path,
) -> None:
    bad = a_middle_file(lake)
    expected = len(fx.utilization()) - rows_of([bad])
    fx.damage(bad, "damaged pages")
    with Lake(lake) as reader:
        assert reader.skipped == {}, "the footer is intact: the cheap check passes it"
        result = reader.sql("SELECT count(util_mean), sum(util_mean) FROM raw_utilization")
        assert result.rows[0][0] == expected
        assert list(reader.skipped) == [bad]


def test_a_damaged_compacted_file_hides_nothing(lake: Path) -> None:
    total = count(lake)
    compact(lake, KEEPING)  # merged files are kept, superseded, for compact_keep_s
    merged = [f for d in partition_dirs(lake, "utilization") for f in files_in(d) if f.compacted]
    assert merged
    fx.damage(merged[0].path, "zero-byte")
    good, broken = check_dir(merged[0].path.parent)
    assert [b.path for b in broken] == [merged[0].path]
    assert all(not f.compacted for f in good), "the files it merged are read again"
    assert count(lake) == total


def test_compaction_quarantines_bad_files_and_keeps_every_other_row_once(lake: Path) -> None:
    bad = a_middle_file(lake)
    expected = len(fx.utilization()) - rows_of([bad])
    relative = bad.relative_to(lake)
    fx.damage(bad, "corrupt")
    report = compact(lake, MERGE_NOW)
    assert [q.path for q in report.quarantined] == [bad]
    assert not bad.exists() and (lake / QUARANTINE_DIR / relative).is_file()
    assert quarantined_files(lake) == [lake / QUARANTINE_DIR / relative]
    assert report.files_merged > 0
    assert count(lake) == expected
    assert readable_files(lake, "utilization")[1] == []
    again = compact(lake, MERGE_NOW)
    assert again.quarantined == [] and count(lake) == expected


def test_compaction_quarantines_a_file_whose_pages_fail_while_merging(lake: Path) -> None:
    bad = a_middle_file(lake)
    expected = len(fx.utilization()) - rows_of([bad])
    fx.damage(bad, "damaged pages")
    report = compact(lake, MERGE_NOW)
    assert [q.path for q in report.quarantined] == [bad]
    assert report.quarantined[0].reason.startswith("damaged data")
    assert report.files_merged > 0 and count(lake) == expected


def test_a_damaged_compacted_file_is_quarantined_before_its_sources_are_deleted(
    lake: Path,
) -> None:
    total = count(lake)
    compact(lake, KEEPING)
    merged = [f for d in partition_dirs(lake, "utilization") for f in files_in(d) if f.compacted]
    fx.damage(merged[0].path, "damaged pages")  # the cheap check cannot see it
    report = compact(lake, MERGE_NOW)  # keep_s 0: the sources would go now
    assert [q.path for q in report.quarantined] == [merged[0].path]
    assert count(lake) == total, "the merged sources were kept and are read again"


def test_uncommitted_bad_files_are_skipped_but_left_for_the_sink(tmp_path: Path) -> None:
    writer = LakeWriter(tmp_path, LakeSettings())
    for offset, row in enumerate(fx.utilization()[:50]):
        writer.add("utilization", row, ("t.utilization", 0, offset))
    writer.flush()  # written, never committed: a replay may still replace it
    (path,) = visible_files(tmp_path, "utilization")
    fx.damage(path, "zero-byte")
    report = compact(tmp_path, MERGE_NOW)
    assert report.quarantined == [] and path.exists()
    good, broken = readable_files(tmp_path, "utilization")
    assert good == [] and [b.path for b in broken] == [path] and count(tmp_path) == 0


def test_quarantine_keeps_the_relative_path_and_never_overwrites(lake: Path) -> None:
    path = a_middle_file(lake)
    data = path.read_bytes()
    first = quarantine(lake, path)
    assert first == lake / QUARANTINE_DIR / path.relative_to(lake)
    path.write_bytes(data)
    second = quarantine(lake, path)
    assert second == first.with_name(f"{path.name}.2") and first.is_file()
    with Lake(lake) as reader:  # never read from _quarantine
        assert reader.skipped == {}
        assert reader.sql("SELECT count(*) FROM raw_utilization").rows[0][0] == (
            len(fx.utilization()) - rows_of([first]))
