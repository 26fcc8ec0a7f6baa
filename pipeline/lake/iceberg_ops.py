"""Operations on the Iceberg lake (`fleetpulse lake status|compact`): status per table;
compaction per day partition, quarantine of unreadable files, retention per table, the hourly
utilization rollup (pipeline/lake/iceberg_rollup.py) and snapshot expiry."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipeline.config import LakeSettings
from pipeline.errors import ConfigError, SinkError
from pipeline.lake import iceberg_rollup
from pipeline.lake.iceberg import (
    COMMIT_ATTEMPTS,
    OFFSETS_KEY,
    _catalog_busy,
    _day,
    _first_line,
    _key,
    _pause,
    arrow_schema,
    committed_offsets,
    day_rows,
    encode_offsets,
    open_catalog,
    rollup_table,
    s3_filesystem,
    table,
)
from pipeline.lake.iceberg_read import prune_cache
from pipeline.lake.tables import TABLES, TableSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableStatus:
    name: str
    snapshots: int
    files: int
    rows: int
    bytes: int
    oldest_day: str | None
    newest_day: str | None


def status(settings: LakeSettings) -> list[TableStatus]:
    """Per table (and the hourly rollup, once `lake compact` has made it): snapshots, data
    files, rows, bytes, oldest and newest day partition."""
    catalog = open_catalog(settings)
    found_all = []
    tables = [(spec.name, table(catalog, settings, spec, create=False))
              for spec in TABLES.values()]
    rollup = rollup_table(catalog, settings, create=False)
    if rollup is not None:
        tables.append((iceberg_rollup.ROLLUP_TABLE, rollup))
    for name, found in tables:
        if found is None:
            found_all.append(TableStatus(name, 0, 0, 0, 0, None, None))
            continue
        files = [task.file for task in found.scan().plan_files()]
        days = sorted({day for day in map(_day, files) if day is not None})
        found_all.append(TableStatus(
            name, len(found.metadata.snapshots), len(files),
            sum(f.record_count for f in files), sum(f.file_size_in_bytes for f in files),
            days[0] if days else None, days[-1] if days else None))
    return found_all


@dataclass
class CompactReport:
    partitions: int = 0
    files_merged: int = 0
    files_written: int = 0
    rows: int = 0
    snapshots_expired: int = 0
    conflicts: int = 0
    cache_files_removed: int = 0
    files_dropped: int = 0  # data files of day partitions past lake.retention_days
    rollup_days: int = 0  # days of utilization rolled up (again) into utilization_hourly
    rollup_rows: int = 0
    # data files that could not be read: out of the table, a copy under _quarantine (key, why)
    quarantined: list[tuple[str, str]] = field(default_factory=list)


def compact(settings: LakeSettings, names: Sequence[str] | None = None, *,
            now: datetime, verify: bool = False) -> CompactReport:
    """Merge the small data files of each day partition: once a day holds
    lake.compact_min_files files under lake.compact_rows rows, they are replaced, in one
    commit, by files of their rows (at most about compact_rows rows read at a time; big files
    are left as they are; the offsets carried forward). A writer's commit in between makes
    ours fail: the partition is listed again and retried. Then snapshots older than
    lake.snapshot_keep_s are expired (the current one is always kept).

    A data file that cannot be read when it is merged (or, with `verify`, any current data
    file: each is read in full) is quarantined: copied to `<lake.uri>/_quarantine/<its path
    under lake.uri>` when the bucket still has it, and removed from the table in one commit
    (the offsets carried forward), so every engine reads the rest."""
    known = {*TABLES, iceberg_rollup.ROLLUP_TABLE}
    for setting in ("retention_days", "snapshot_keep_s_by_table"):
        unknown = sorted(set(getattr(settings, setting)) - known)
        if unknown:
            raise ConfigError(f"lake.{setting}: unknown table {', '.join(unknown)}: expected "
                              f"one of {', '.join(sorted(known))}")
    catalog = open_catalog(settings)
    filesystem = s3_filesystem(settings)
    report = CompactReport()
    listed: set[str] = set()
    for name in names or list(TABLES):
        spec = TABLES[name]
        found = table(catalog, settings, spec, create=False)
        if found is None:
            continue
        report.files_dropped += _retain(found, settings, name, spec.columns[0].name, now)
        if verify:
            found.refresh()
            every = [task.file for task in found.scan().plan_files()]
            _read_or_quarantine(found, every, spec, settings, filesystem, report)
        conflicts = 0
        while conflicts < COMMIT_ATTEMPTS:
            found.refresh()
            batch = _small_files(found, settings)
            if not batch:
                break
            rows = _read_or_quarantine(found, batch, spec, settings, filesystem, report)
            if rows is None:  # some were quarantined: list the partition again
                continue
            try:
                written = _replace_files(found, batch, rows)
            except _catalog_busy() as exc:
                _pause(conflicts, f"compacting {name}", exc)
                conflicts += 1
                report.conflicts += 1
                continue
            report.partitions += 1
            report.files_merged += len(batch)
            report.files_written += written
            report.rows += rows.num_rows
        report.snapshots_expired += _expire(found, now - _snapshot_keep(settings, name))
        listed |= {_key(task.file.file_path) for task in found.scan().plan_files()}
    if not names or iceberg_rollup.SOURCE_TABLE in names:
        report.rollup_days, report.rollup_rows = refresh_rollup(settings, catalog,
                                                                        filesystem)
        rollup = rollup_table(catalog, settings)
        name = iceberg_rollup.ROLLUP_TABLE
        report.files_dropped += _retain(rollup, settings, name, "hour", now)
        report.snapshots_expired += _expire(rollup, now - _snapshot_keep(settings, name))
        listed |= {_key(task.file.file_path) for task in rollup.scan().plan_files()}
    if not names:  # every table listed: what no current snapshot holds leaves the cache
        cutoff = (now - timedelta(seconds=settings.compact_keep_s)).timestamp()
        report.cache_files_removed = prune_cache(settings, listed, cutoff)
    return report


def _read_or_quarantine(found: Any, data_files: list[Any], spec: TableSpec,
                        settings: LakeSettings, filesystem: pafs.S3FileSystem,
                        report: CompactReport) -> pa.Table | None:
    """The rows of `data_files`, each read in full and validated; None when some cannot be
    read: those are quarantined (see `compact`) and the caller lists the table again."""
    parts, bad = [], []
    for data_file in data_files:
        key = _key(data_file.file_path)
        try:
            part = ds.dataset(key, schema=arrow_schema(spec), format="parquet",
                              filesystem=filesystem).to_table()
            part.validate(full=True)
            parts.append(part)
        except (OSError, pa.ArrowException) as exc:
            bad.append((data_file, _first_line(exc)))
    if not bad:
        return pa.concat_tables(parts) if parts else arrow_schema(spec).empty_table()
    for data_file, reason in bad:
        key = _key(data_file.file_path)
        target = quarantine_key(settings, key)
        try:
            filesystem.copy_file(key, target)
            reason += f" (a copy is at s3://{target})"
        except (OSError, pa.ArrowException) as exc:
            reason += f" (no copy: {_first_line(exc)})"
        log.warning("warning: quarantined unreadable lake file s3://%s: %s", key, reason)
        report.quarantined.append((key, reason))
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            found.refresh()
            listed = {task.file.file_path for task in found.scan().plan_files()}
            gone = [f for f, _ in bad if f.file_path in listed]
            if gone:
                _replace_files(found, gone, arrow_schema(spec).empty_table())
            return None
        except _catalog_busy() as exc:
            _pause(attempt, f"quarantining files of {spec.name}", exc)
    raise SinkError(f"lake: table {spec.name}: {COMMIT_ATTEMPTS} commits in a row lost to "
                    "other writers while quarantining files")


def quarantine_key(settings: LakeSettings, key: str) -> str:
    """Where an unreadable object's copy goes: `<lake.uri>/_quarantine/<its path under it>`."""
    root = _key(settings.uri.rstrip("/"))
    return f"{root}/_quarantine/{key.removeprefix(root + '/')}"


def _snapshot_keep(settings: LakeSettings, name: str) -> timedelta:
    return timedelta(seconds=settings.snapshot_keep_s_by_table.get(name,
                                                                   settings.snapshot_keep_s))


def _retain(found: Any, settings: LakeSettings, name: str, column: str, now: datetime) -> int:
    """Drop the table's day partitions older than lake.retention_days[name] days before
    `now`'s day (whole files: the cut is a day boundary); the data files dropped. The offsets
    are carried into the delete's snapshot (expiry may remove the snapshots that had them)."""
    days = settings.retention_days.get(name)
    if days is None:
        return 0
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    cut = (today - timedelta(days=days)).replace(tzinfo=None).isoformat(timespec="microseconds")
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            found.refresh()
            before = found.current_snapshot()
            offsets = committed_offsets(found)
            properties = {OFFSETS_KEY: encode_offsets(offsets)} if offsets else {}
            with warnings.catch_warnings():  # no day old enough: nothing to say
                warnings.filterwarnings("ignore", "Delete operation did not match")
                found.delete(f"{column} < '{cut}'", snapshot_properties=properties)
            after = found.current_snapshot()
            if after is None or (before is not None and after.snapshot_id == before.snapshot_id):
                return 0
            summary = after.summary.additional_properties if after.summary else {}
            return int(summary.get("deleted-data-files", 0))
        except _catalog_busy() as exc:
            _pause(attempt, f"dropping old days of {name}", exc)
    raise SinkError(f"lake: table {name}: {COMMIT_ATTEMPTS} retention commits in a row lost "
                    "to other writers")


def _small_files(found: Any, settings: LakeSettings) -> list[Any]:
    """The oldest day's small files to merge next, up to about compact_rows rows; none when
    no day holds compact_min_files of them."""
    by_day: dict[str, list[Any]] = {}
    for task in found.scan().plan_files():
        day = _day(task.file)
        if day is not None and task.file.record_count < settings.compact_rows:
            by_day.setdefault(day, []).append(task.file)
    for day in sorted(by_day):
        files = sorted(by_day[day], key=lambda f: str(f.file_path))
        if len(files) < settings.compact_min_files:
            continue
        batch: list[Any] = []
        rows = 0
        for data_file in files:
            if batch and rows + data_file.record_count > settings.compact_rows:
                break
            batch.append(data_file)
            rows += data_file.record_count
        if len(batch) >= 2:
            return batch
    return []


def _replace_files(found: Any, old: list[Any], rows: pa.Table) -> int:
    """One commit that removes `old` and adds files holding `rows` (the same rows); the
    number of files written. Raises what a lost commit raises (see _catalog_busy)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    offsets = {OFFSETS_KEY: encode_offsets(committed_offsets(found))}
    written = 0
    change = found.transaction()
    with change, change.update_snapshot(snapshot_properties=offsets).overwrite() as rewrite:
        for data_file in old:
            rewrite.delete_data_file(data_file)
        for data_file in _dataframe_to_data_files(
            table_metadata=change.table_metadata, df=rows, io=found.io,
            write_uuid=rewrite.commit_uuid,
        ):
            rewrite.append_data_file(data_file)
            written += 1
    return written


def _expire(found: Any, before: datetime) -> int:
    found.refresh()
    current = found.current_snapshot()
    old = [s.snapshot_id for s in found.metadata.snapshots
           if s.timestamp_ms < before.timestamp() * 1000
           and (current is None or s.snapshot_id != current.snapshot_id)]
    if old:
        found.maintenance.expire_snapshots().by_ids(old).commit()
    return len(old)


# --- the hourly utilization rollup (pipeline/lake/iceberg_rollup.py) -------------------------


def refresh_rollup(settings: LakeSettings, catalog: Any, filesystem: Any) -> tuple[int, int]:
    """Roll up again every day whose utilization row count differs from the rollup's; (days
    rolled up, rollup rows written). Days the raw table no longer holds (its retention) keep
    their rollup rows."""
    source = table(catalog, settings, TABLES[iceberg_rollup.SOURCE_TABLE], create=False)
    if source is None:
        return (0, 0)
    rollup = rollup_table(catalog, settings)
    files = [task.file for task in source.scan().plan_files()]
    current = day_rows(files)
    built = rollup.scan(selected_fields=("hour", "day_rows")).to_arrow()
    done = iceberg_rollup.rolled_up_days(built)
    stale = sorted(day for day, n in current.items() if done.get(day) != n)
    days = written = 0
    for day in stale:
        keys = [_key(f.file_path) for f in files if _day(f) == day]
        rows = iceberg_rollup.aggregate_files(keys, filesystem)
        rows = rows.append_column("day_rows", pa.array([current[day]] * rows.num_rows,
                                                       pa.int64())).cast(iceberg_rollup.ROLLUP_SCHEMA)
        start = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC)
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                rollup.refresh()
                with warnings.catch_warnings():  # a first rollup of the day replaces nothing
                    warnings.filterwarnings("ignore", "Delete operation did not match")
                    rollup.overwrite(rows, overwrite_filter=iceberg_rollup.day_filter(start))
                break
            except _catalog_busy() as exc:  # another compaction: do it again on its snapshot
                _pause(attempt, f"rolling up {day}", exc)
        else:
            raise SinkError(f"lake: rollup of {day}: {COMMIT_ATTEMPTS} commits in a row lost to "
                            "other compactions")
        days += 1
        written += rows.num_rows
    return (days, written)
