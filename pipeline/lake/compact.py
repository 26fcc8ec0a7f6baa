"""Compaction: merge a partition's small files into few large ones, while the sink keeps writing.

Only files whose offsets the sink has committed are merged (`LakeWriter.mark_committed`): a file
above the committed offset may still be replaced by a replay after a crash, and merging it would
let the replay add its rows a second time. Files of one (topic, partition) are merged in offset
order into `<topic>-<partition>-<first>-to-<last>.parquet`; once that file is renamed into
place, readers (`visible_files`) ignore the files it holds. Those are deleted only after
lake.compact_keep_s, by a later run, so a query that listed them just before the swap can still
read them. No moment exists at which a row is missing or counted twice.

Unreadable files (pipeline/lake/check.py) are moved to `<lake>/_quarantine/<same relative
path>` instead, once committed (an uncommitted one may yet be replaced by a replay; readers skip
it meanwhile): those the cheap check finds first, then any whose pages fail to decode while a
merge reads them, after which the partition is planned again without them. A compacted file is
read in full before the files it holds are deleted, so a damaged one is quarantined while its
rows still exist in those files, which readers then see again.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import LakeSettings
from pipeline.errors import SinkError
from pipeline.lake.check import (
    BadFile,
    UnreadableFileError,
    check_dir,
    check_file,
    quarantine,
    read_checked,
)
from pipeline.lake.tables import TABLES, TableSpec
from pipeline.lake.writer import (
    LakeFile,
    Positions,
    compacted_file_name,
    parse_file,
    partition_dirs,
    read_committed,
    superseded_in,
    write_atomically,
    write_parquet,
)


@dataclass
class CompactionReport:
    directories: int = 0
    files_merged: int = 0
    files_written: int = 0
    rows: int = 0
    tmp_removed: int = 0
    superseded_removed: int = 0
    quarantined: list[BadFile] = field(default_factory=list)  # files moved away, and why


def compact(
    root: Path | str, settings: LakeSettings, tables: list[str] | None = None,
    verify: bool = False,
) -> CompactionReport:
    """Compact every partition directory of `tables` (default: all) under `root`.

    With `verify`, every file is read in full first, to quarantine damaged data pages too.
    """
    root = Path(root)
    report = CompactionReport()
    committed = read_committed(root)
    for name in tables or list(TABLES):
        for directory in partition_dirs(root, name):
            report.directories += 1
            report.tmp_removed += _remove_stale_tmp(directory, settings.stale_tmp_s)
            for bad in check_dir(directory, deep=verify)[1]:
                if _committed(bad.path, committed):
                    _quarantine(root, bad.path, bad.reason, report)
            _merge_all(root, TABLES[name], directory, committed, settings, report)
            report.superseded_removed += _remove_superseded(root, directory,
                                                            settings.compact_keep_s, report)
    return report


def _committed(path: Path, committed: Positions) -> bool:
    lake_file = parse_file(path)
    return lake_file is not None and lake_file.first < committed.get(
        (lake_file.topic, lake_file.partition), 0)


def _quarantine(root: Path, path: Path, reason: str, report: CompactionReport) -> None:
    try:
        quarantine(root, path)
        report.quarantined.append(BadFile(path, reason))
    except FileNotFoundError:
        pass  # gone already: nothing left to move
    except OSError as exc:
        raise SinkError(f"lake: cannot quarantine {path} ({reason}): {exc}") from exc


def _merge_all(root: Path, spec: TableSpec, directory: Path, committed: Positions,
               settings: LakeSettings, report: CompactionReport) -> None:
    while True:  # planned again after each damaged file, which has then left the directory
        try:
            for run in _runs(directory, committed, settings):
                report.rows += _merge(spec, directory, run, settings)
                report.files_merged += len(run)
                report.files_written += 1
            return
        except UnreadableFileError as exc:
            _quarantine(root, exc.path, exc.reason, report)


def _runs(directory: Path, committed: Positions, settings: LakeSettings) -> list[list[LakeFile]]:
    """Groups of committed files to merge: per (topic, partition), contiguous, size-capped."""
    done = [f for f in check_dir(directory)[0]
            if f.first < committed.get((f.topic, f.partition), 0)]
    runs: list[list[LakeFile]] = []
    for _, group in groupby(done, key=lambda f: (f.topic, f.partition)):
        files = list(group)
        if len(files) < settings.compact_min_files:
            continue
        run: list[LakeFile] = []
        rows = 0
        for lake_file in files:
            count = _rows(lake_file)
            if run and rows + count > settings.compact_rows:
                runs.append(run)
                run, rows = [], 0
            run.append(lake_file)
            rows += count
        runs.append(run)
    return [run for run in runs if len(run) > 1]


def _merge(spec: TableSpec, directory: Path, run: list[LakeFile], settings: LakeSettings) -> int:
    tables = [read_checked(f.path) for f in run]  # UnreadableFileError: the caller quarantines it
    last = max(_last_offset(f) for f in run)
    merged = _conform(pa.concat_tables(tables, promote_options="permissive"), spec)
    metadata = {
        **(spec.schema.metadata or {}),
        b"fleetpulse.topic": run[0].topic.encode(),
        b"fleetpulse.partition": str(run[0].partition).encode(),
        b"fleetpulse.first_offset": str(run[0].first).encode(),
        b"fleetpulse.last_offset": str(last).encode(),
    }
    merged = merged.replace_schema_metadata(metadata)
    target = directory / compacted_file_name(run[0].topic, run[0].partition, run[0].first, last)
    write_atomically(target, lambda tmp: write_parquet(tmp, merged, settings))
    return int(merged.num_rows)


def _conform(table: pa.Table, spec: TableSpec) -> pa.Table:
    """Current columns first (NULL where old files lacked them), then any the code doesn't know."""
    columns, names = [], []
    for schema_field in spec.schema:
        if schema_field.name in table.column_names:
            columns.append(table[schema_field.name].cast(schema_field.type))
        else:
            columns.append(pa.nulls(table.num_rows, schema_field.type))
        names.append(schema_field.name)
    for name in table.column_names:
        if name not in names:
            columns.append(table[name])
            names.append(name)
    return pa.Table.from_arrays(columns, names=names)


def _rows(lake_file: LakeFile) -> int:
    return int(pq.ParquetFile(lake_file.path).metadata.num_rows)


def _last_offset(lake_file: LakeFile) -> int:
    metadata = pq.read_schema(lake_file.path).metadata or {}
    value = metadata.get(b"fleetpulse.last_offset")
    return int(value) if value is not None else lake_file.last


def _remove_superseded(root: Path, directory: Path, keep_s: int,
                       report: CompactionReport) -> int:
    removed = 0
    cutoff = time.time() - keep_s
    for lake_file, holder in superseded_in(directory):
        with contextlib.suppress(FileNotFoundError):
            if holder.path.stat().st_mtime > cutoff:
                continue
            # the holder's rows must be readable before the only other copy of them goes
            reason = check_file(holder.path, deep=True)
            if reason is not None:
                _quarantine(root, holder.path, reason, report)
                continue
            lake_file.path.unlink()
            removed += 1
    return removed


def _remove_stale_tmp(directory: Path, stale_s: int) -> int:
    # A temporary file this old belongs to a writer that crashed mid-write: nobody renames it.
    removed = 0
    cutoff = time.time() - stale_s
    for entry in os.scandir(directory):
        if entry.name.startswith(".") and entry.name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
    return removed
