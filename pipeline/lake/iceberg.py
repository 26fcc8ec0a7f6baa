"""The lake as Apache Iceberg tables on an S3-API object store (`lake.uri = "s3://…"`).

Every table of pipeline/lake/tables.py (TABLES) is an Iceberg table `<lake.namespace>.<name>`
in a SQL catalog (`lake.catalog`: SQLite for one machine, PostgreSQL for many), its schema the
table's Arrow schema (derived from the event model: nothing written here by hand), partitioned
by the day of its time column. Event-time columns are Iceberg `timestamp` (microseconds): the
local lake's millisecond columns are widened on write.

Exactly once with several writers (`fleetpulse sink lake` processes in one consumer group):
every append records, in its snapshot's summary under `fleetpulse.offsets`, the next Kafka
offset per topic-partition that the table holds (the last value carried forward, as Iceberg's
own Kafka Connect sink does). Before committing, a writer reads those offsets from the table's
current snapshot and drops the rows the table already holds; a commit another writer got in
first fails (the catalog checks the table's metadata did not move) and is tried again on the
new snapshot. So a replay after a crash or a rebalance never adds a row twice, and no commit
overwrites another's.

The S3 client (pyarrow's AWS SDK) is told to compute and check request/response checksums only
when the store requires them (AWS_REQUEST_CHECKSUM_CALCULATION / AWS_RESPONSE_CHECKSUM_VALIDATION
= WHEN_REQUIRED, unless set otherwise): stores other than AWS (s3proxy, Ceph, GCS's S3 API)
refuse the SDK's default flexible checksums.

Readers (pipeline/lake/query.py) read each table's current data files from a local copy
(IcebergSource: lake.cache_path), fetched once: Iceberg data files never change; given a range,
only utilization's days of it. `compact` merges small files, quarantines unreadable ones,
drops day partitions past lake.retention_days, keeps the hourly utilization rollup
(pipeline/lake/iceberg_rollup.py) and expires snapshots.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipeline.config import LakeSettings
from pipeline.errors import ConfigError, SinkError
from pipeline.lake import iceberg_rollup
from pipeline.lake.columns import TIMESTAMP
from pipeline.lake.tables import TABLES, TableSpec
from pipeline.model import Event

Positions = dict[tuple[str, int], int]  # (topic, partition) -> next offset (as in writer.py)

OFFSETS_KEY = "fleetpulse.offsets"
CHECKSUM_ENV = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
}
ICEBERG_TIMESTAMP = pa.timestamp("us")
DAY_FIELD_ID = 1000  # Iceberg numbers partition fields from 1000
# Partitioned by cluster as well as by day: the one table big enough for it to prune (an
# engine's query of one cluster reads that cluster's files); the event tables are small.
CLUSTER_PARTITIONED = frozenset({"utilization"})
COMMIT_ATTEMPTS = 20
# pyiceberg retries a lost commit itself by replaying it onto the new snapshot, with the summary
# it had: the offsets another writer just committed would be dropped from it. So it may not;
# IcebergWriter retries, reading the offsets again.
OWN_RETRIES = {"commit.retry.num-retries": "0"}
log = logging.getLogger(__name__)


def configure_s3_client() -> None:
    """The checksum settings every S3-API store accepts (see the module doc), unless the
    environment says otherwise. Before the first S3 client is made: the SDK reads them once."""
    for name, value in CHECKSUM_ENV.items():
        os.environ.setdefault(name, value)


def catalog_properties(settings: LakeSettings) -> dict[str, str]:
    """pyiceberg's SQL catalog properties for `settings` (warehouse = lake.uri)."""
    properties = {"uri": settings.catalog, "warehouse": settings.uri.rstrip("/"),
                  "s3.region": settings.s3_region}
    if settings.s3_endpoint:
        properties["s3.endpoint"] = settings.s3_endpoint
    if settings.s3_access_key_id:
        properties["s3.access-key-id"] = settings.s3_access_key_id
        properties["s3.secret-access-key"] = settings.s3_secret_access_key
    return properties


def open_catalog(settings: LakeSettings) -> Any:
    """The SQL catalog (its tables are created on first use, by `table`)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    if not settings.uri:
        raise SinkError("lake: lake.uri is empty: the lake is the local Parquet one")
    from sqlalchemy.exc import SQLAlchemyError

    configure_s3_client()
    try:
        catalog = SqlCatalog("fleetpulse", **catalog_properties(settings))
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                catalog.create_namespace_if_not_exists(settings.namespace)
                break
            except NamespaceAlreadyExistsError:  # another process made it meanwhile
                break
            except _catalog_busy() as exc:
                _pause(attempt, "creating the namespace", exc)
    except SQLAlchemyError as exc:
        raise ConfigError(f"lake.catalog {_without_password(settings.catalog)}: cannot open "
                          f"the Iceberg catalog: {_first_line(exc)}") from exc
    return catalog


def _without_password(url: str) -> str:
    """A SQLAlchemy URL as it may be shown: its password hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ValueError, TypeError):
        return "(unparsable URL)"


def _catalog_busy() -> tuple[type[BaseException], ...]:
    """What a commit another writer got in first raises: pyiceberg's conflict, or the SQL
    catalog's database locked by another writer's transaction (SQLite)."""
    from pyiceberg.exceptions import CommitFailedException
    from sqlalchemy.exc import OperationalError

    return (CommitFailedException, OperationalError)


def _pause(attempt: int, what: str, exc: BaseException) -> None:
    """Wait before trying again after a lost commit; anything else (an SQL error that is not
    another writer's lock) is raised as it is."""
    if not (type(exc).__name__ == "CommitFailedException" or _locked(exc)):
        raise exc
    log.info("lake: %s: lost to another writer (%s); trying again", what, _first_line(exc))
    time.sleep(min(0.05 * 2**attempt, 2.0))


def _locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text or "could not serialize" in text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def s3_filesystem(settings: LakeSettings, *, create_buckets: bool = False) -> pafs.S3FileSystem:
    """pyarrow's S3 client for the lake's store (FleetPulse's own: the checksum settings)."""
    configure_s3_client()
    options: dict[str, Any] = {"region": settings.s3_region,
                               "allow_bucket_creation": create_buckets}
    if settings.s3_endpoint:
        endpoint = urlsplit(settings.s3_endpoint)
        options["endpoint_override"] = endpoint.netloc or settings.s3_endpoint
        options["scheme"] = endpoint.scheme or "https"
    if settings.s3_access_key_id:
        options["access_key"] = settings.s3_access_key_id
        options["secret_key"] = settings.s3_secret_access_key
    return pafs.S3FileSystem(**options)


def create_bucket(settings: LakeSettings) -> None:
    """Create lake.uri's bucket if it is missing (a test store, a first deployment)."""
    bucket = urlsplit(settings.uri).netloc
    s3_filesystem(settings, create_buckets=True).create_dir(bucket)


def arrow_schema(spec: TableSpec) -> pa.Schema:
    """The table's Arrow schema as stored in Iceberg: timestamps in microseconds."""
    return pa.schema([
        pa.field(f.name, ICEBERG_TIMESTAMP if f.type == TIMESTAMP else f.type)
        for f in spec.schema
    ])


def iceberg_schema(spec: TableSpec) -> Any:
    """The Iceberg schema of a lake table, derived from its Arrow schema (field ids 1…n)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema(spec)))


def partition_spec(spec: TableSpec, schema: Any) -> Any:
    """Partitioned by the day of the table's time column (its first); the big tables in
    CLUSTER_PARTITIONED by cluster too."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, IdentityTransform

    source = schema.find_field(spec.columns[0].name).field_id
    fields = [PartitionField(source_id=source, field_id=DAY_FIELD_ID, transform=DayTransform(),
                             name="day")]
    if spec.name in CLUSTER_PARTITIONED:
        fields.append(PartitionField(source_id=schema.find_field("cluster").field_id,
                                     field_id=DAY_FIELD_ID + 1, transform=IdentityTransform(),
                                     name="cluster"))
    return PartitionSpec(*fields)


def table(catalog: Any, settings: LakeSettings, spec: TableSpec, *, create: bool = True) -> Any:
    """The Iceberg table of `spec`, created if missing (when `create`), its schema evolved
    to the spec's (a new column of a new table version is added; none is ever removed).
    None when it does not exist and `create` is false."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    name = f"{settings.namespace}.{spec.name}"
    try:
        found = catalog.load_table(name)
    except NoSuchTableError:
        if not create:
            return None
        schema = iceberg_schema(spec)
        try:
            return catalog.create_table(
                name, schema=schema, partition_spec=partition_spec(spec, schema),
                properties={"fleetpulse.table": spec.name,
                            "fleetpulse.version": str(spec.version), **OWN_RETRIES})
        except TableAlreadyExistsError:  # another writer created it meanwhile
            return catalog.load_table(name)
    if create and any(found.properties.get(k) != v for k, v in OWN_RETRIES.items()):
        with found.transaction() as change:
            change.set_properties(OWN_RETRIES)
        found = catalog.load_table(name)
    if create:
        have = {f.name for f in found.schema().fields}
        if any(f.name not in have for f in spec.schema):
            with found.update_schema() as update:
                update.union_by_name(arrow_schema(spec))
            found = catalog.load_table(name)
    return found


def committed_offsets(found: Any) -> Positions:
    """The offsets an Iceberg table holds: `fleetpulse.offsets` of its newest snapshot that
    has them (a snapshot made by another engine may lack them)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(found.current_snapshot(), found.metadata):
        text = (snapshot.summary.additional_properties if snapshot.summary else {}).get(OFFSETS_KEY)
        if text is not None:
            return decode_offsets(text)
    return {}


def encode_offsets(positions: Mapping[tuple[str, int], int]) -> str:
    return json.dumps({f"{topic}:{partition}": offset
                       for (topic, partition), offset in sorted(positions.items())})


def decode_offsets(text: str) -> Positions:
    positions: Positions = {}
    for key, offset in json.loads(text).items():
        topic, _, partition = key.rpartition(":")
        positions[(topic, int(partition))] = int(offset)
    return positions


@dataclass
class _Chunk:
    """Rows of one topic-partition waiting for the next commit."""

    events: list[Event] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


class IcebergWriter:
    """LakeWriter's interface (add/extend/flush/discard/mark_committed/checkpoint) over Iceberg
    tables: `flush` commits one append per table, each row once (see the module doc)."""

    def __init__(self, settings: LakeSettings, catalog: Any | None = None) -> None:
        self.settings = settings
        self.catalog = open_catalog(settings) if catalog is None else catalog
        self._tables: dict[str, Any] = {}
        self._pending: dict[tuple[str, str, int], _Chunk] = {}
        self.pending_rows = 0
        self.rows_written = 0
        self.files_written = 0
        self.commits = 0
        self.commit_conflicts = 0  # commits another writer got in first (retried)
        self.rows_already_in_lake = 0  # replayed rows the table held already (dropped)
        for name in TABLES:  # every table exists from the first writer on (other engines see them)
            self.table(name)

    def add(self, name: str, event: Event, source: tuple[str, int, int]) -> None:
        topic, partition, offset = source
        self.extend(name, [event], topic, partition, [offset])

    def extend(self, name: str, events: Sequence[Event], topic: str, partition: int,
               offsets: Sequence[int]) -> None:
        if len(events) != len(offsets):
            raise SinkError(f"lake: {len(events)} events but {len(offsets)} offsets")
        if not events:
            return
        spec = TABLES.get(name)
        if spec is None:
            raise SinkError(f"lake: unknown table {name!r}: expected one of {', '.join(TABLES)}")
        wrong = sorted(t.__name__ for t in set(map(type, events)) if not issubclass(t, spec.event))
        if wrong:
            raise SinkError(f"lake: table {name!r} takes {spec.event.__name__}, "
                            f"got {', '.join(wrong)}")
        if partition < 0 or min(offsets) < 0:
            raise SinkError(f"lake: bad source {(topic, partition, min(offsets))!r}")
        chunk = self._pending.setdefault((name, topic, partition), _Chunk())
        chunk.events.extend(events)
        chunk.offsets.extend(offsets)
        self.pending_rows += len(events)

    def table(self, name: str) -> Any:
        found = self._tables.get(name)
        attempt = 0
        while found is None:
            try:
                found = self._tables[name] = table(self.catalog, self.settings, TABLES[name])
            except _catalog_busy() as exc:  # writers starting together create the same tables
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise SinkError(f"lake: cannot create table {name}: {exc}") from exc
                _pause(attempt, f"creating {name}", exc)
                attempt += 1
        return found

    def committed(self) -> Positions:
        """Every table's committed offsets (a topic feeds one table)."""
        positions: Positions = {}
        for spec in TABLES.values():
            found = table(self.catalog, self.settings, spec, create=False)
            if found is not None:
                positions |= committed_offsets(found)
        return positions

    def flush(self) -> Positions:
        """Commit every table's buffered rows; the next offset per topic-partition flushed.
        Raises SinkError when a table cannot be committed (the buffers are kept)."""
        by_table: dict[str, list[tuple[str, int, _Chunk]]] = {}
        for (name, topic, partition), chunk in sorted(self._pending.items()):
            by_table.setdefault(name, []).append((topic, partition, chunk))
        positions: Positions = {}
        for name, chunks in by_table.items():
            self._commit(name, chunks)
            for topic, partition, chunk in chunks:
                positions[(topic, partition)] = max(chunk.offsets) + 1
                del self._pending[(name, topic, partition)]
                self.pending_rows -= len(chunk.events)
        return positions

    def _commit(self, name: str, chunks: list[tuple[str, int, _Chunk]]) -> None:
        spec = TABLES[name]
        converted = [(topic, partition, np.asarray(chunk.offsets, dtype=np.int64),
                      spec.to_arrow(chunk.events).cast(arrow_schema(spec)))
                     for topic, partition, chunk in chunks]
        found = self.table(name)
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                found.refresh()
            except _catalog_busy() as exc:
                _pause(attempt, f"reading {name}", exc)
                continue
            held = committed_offsets(found)
            parts, dropped = [], 0
            offsets = dict(held)
            for topic, partition, numbers, arrow in converted:
                start = held.get((topic, partition), 0)
                keep = numbers >= start
                dropped += int((~keep).sum())
                if keep.any():
                    parts.append(arrow if keep.all() else arrow.filter(pa.array(keep)))
                    offsets[(topic, partition)] = max(start, int(numbers.max()) + 1)
            if not parts:
                self.rows_already_in_lake += dropped
                return
            rows = pa.concat_tables(parts)
            try:
                found.append(rows, snapshot_properties={OFFSETS_KEY: encode_offsets(offsets)})
            except _catalog_busy() as exc:  # the retry reads the offsets again: never twice
                self.commit_conflicts += 1
                _pause(attempt, f"committing {name}", exc)
                continue
            except OSError as exc:
                raise SinkError(f"lake: cannot write table {name}: {exc}") from exc
            self.rows_already_in_lake += dropped
            self.rows_written += rows.num_rows
            summary = found.current_snapshot().summary
            self.files_written += int(summary.additional_properties.get("added-data-files", 0))
            self.commits += 1
            return
        raise SinkError(f"lake: table {name}: {COMMIT_ATTEMPTS} commits in a row lost to "
                        "other writers")

    def discard(self) -> None:
        self._pending.clear()
        self.pending_rows = 0

    def mark_committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Nothing to record: the offsets are in the tables' snapshots already."""

    def checkpoint(self) -> Positions:
        return self.flush()


# --- readers ---------------------------------------------------------------------------------


class IcebergSource:
    """What query.Lake reads from Iceberg: each table's current data files, copied once into
    a local cache (lake.cache_path: data files never change once written), where DuckDB scans
    them as it scans the local lake's (a scan through pyarrow's S3 client at every query was
    3-18x slower than the local lake in bench/lake_iceberg.py)."""

    def __init__(self, settings: LakeSettings) -> None:
        self.settings = settings
        self.catalog = open_catalog(settings)
        self.filesystem = s3_filesystem(settings)
        self.cache = cache_dir(settings)
        self.unfetchable: dict[Path, str] = {}  # objects the bucket would not give, and why

    def data_files(self, spec: TableSpec, days: tuple[datetime, datetime] | None = None
                   ) -> list[Any]:
        """The table's current data files; `days`: only those of the day partitions from the
        first's day up to the second (pyiceberg prunes by partition and column bounds)."""
        found = table(self.catalog, self.settings, spec, create=False)
        if found is None:
            return []
        if days is None:
            return [task.file for task in found.scan().plan_files()]
        column, (first, last) = spec.columns[0].name, days
        start = first.replace(hour=0, minute=0, second=0, microsecond=0)
        row_filter = f"{column} >= '{_iso(start)}' AND {column} < '{_iso(last)}'"
        return [task.file for task in found.scan(row_filter=row_filter).plan_files()]

    def local_files(self, spec: TableSpec, days: tuple[datetime, datetime] | None = None
                    ) -> list[Path]:
        """The table's current data files (of `days` only, when given: see data_files) in
        the local cache, fetched if missing."""
        return self.fetch(self.data_files(spec, days))

    def rollup(self) -> tuple[list[Path], dict[str, int]]:
        """The hourly rollup's data files (local copies; none before the first `lake compact`)
        and the utilization rows per day partition now (pipeline/lake/iceberg_rollup.py)."""
        found = rollup_table(self.catalog, self.settings, create=False)
        files = [] if found is None else [task.file for task in found.scan().plan_files()]
        days = day_rows(self.data_files(TABLES[iceberg_rollup.SOURCE_TABLE]))
        return self.fetch(files), days

    def fetch(self, data_files: Sequence[Any]) -> list[Path]:
        """Local copies of `data_files`, fetched into the cache if missing. An object that
        cannot be fetched (gone from the bucket, refused) is left out and named, with why, in
        `unfetchable` (by the path its copy would have)."""
        keys = [_key(f.file_path) for f in data_files]
        wanted = [(key, self.cache / key) for key in keys]
        missing = [(key, path) for key, path in wanted if not path.exists()]
        if missing:
            with ThreadPoolExecutor(max_workers=8, thread_name_prefix="lake-fetch") as pool:
                failed = [f for f in pool.map(lambda pair: self._fetch(*pair), missing) if f]
            self.unfetchable.update(failed)
        return [path for _, path in wanted if path not in self.unfetchable]

    def _fetch(self, key: str, path: Path) -> tuple[Path, str] | None:
        """Copy one object; (its copy's path, why) when the bucket cannot give it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            try:
                with self.filesystem.open_input_stream(key) as source, tmp.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
            except (OSError, pa.ArrowException) as exc:
                return path, f"cannot fetch s3://{key}: {_first_line(exc)}"
            os.replace(tmp, path)
            return None
        finally:
            tmp.unlink(missing_ok=True)


def _iso(when: datetime) -> str:
    """A naive UTC time (or an aware one) as an Iceberg timestamp literal."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds")


def cache_dir(settings: LakeSettings) -> Path:
    return Path(settings.cache_path or Path(settings.path) / "_iceberg_cache")


def prune_cache(settings: LakeSettings, keep: set[str], older_than: float) -> int:
    """Remove cached files that no table's current snapshot lists (`keep`: their keys) and
    that were fetched before `older_than` (epoch seconds: a reader may still be scanning
    them); the number removed."""
    root = cache_dir(settings)
    removed = 0
    for path in root.rglob("*.parquet") if root.is_dir() else ():
        key = path.relative_to(root).as_posix()
        if key not in keep and path.stat().st_mtime < older_than:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _key(path: str) -> str:
    """`s3://bucket/key` → `bucket/key` (pyarrow's S3 paths)."""
    return path.removeprefix("s3://").removeprefix("s3a://")


# --- operations ------------------------------------------------------------------------------


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


def _day(data_file: Any) -> str | None:
    """A data file's day partition as YYYY-MM-DD (Iceberg stores days since the epoch)."""
    value = data_file.partition[0] if len(data_file.partition) else None
    if value is None:
        return None
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=int(value))).strftime("%Y-%m-%d")


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


# --- the hourly utilization rollup (pipeline/lake/iceberg_rollup.py) ---------------------


def _rollup_partition_spec(schema: Any) -> Any:
    """The rollup by the day of `hour`, as the raw table."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    return PartitionSpec(PartitionField(source_id=schema.find_field("hour").field_id,
                                        field_id=DAY_FIELD_ID, transform=DayTransform(),
                                        name="day"))


def rollup_table(catalog: Any, settings: LakeSettings, *, create: bool = True) -> Any:
    """The rollup's Iceberg table, created if missing (when `create`); else None if missing."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
    from pyiceberg.schema import assign_fresh_schema_ids

    name = f"{settings.namespace}.{iceberg_rollup.ROLLUP_TABLE}"
    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        if not create:
            return None
    arrow = iceberg_rollup.ROLLUP_SCHEMA
    schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow))
    properties = {"fleetpulse.table": iceberg_rollup.ROLLUP_TABLE, **OWN_RETRIES}
    try:
        return catalog.create_table(name, schema=schema,
                                    partition_spec=_rollup_partition_spec(schema),
                                    properties=properties)
    except TableAlreadyExistsError:
        return catalog.load_table(name)


def day_rows(data_files: list[Any]) -> dict[str, int]:
    """Rows per day partition ('YYYY-MM-DD'), from the files' manifest entries."""
    counts: dict[str, int] = {}
    for data_file in data_files:
        day = _day(data_file)
        if day is not None:
            counts[day] = counts.get(day, 0) + data_file.record_count
    return counts


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
