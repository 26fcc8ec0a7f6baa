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

This module is the catalog, the store, the tables and the offsets; the rest is beside it:
the writer (iceberg_writer.py: IcebergWriter), the readers' local copies (iceberg_read.py:
IcebergSource, lake.cache_path; given a range, only utilization's days of it), and the
operations (iceberg_ops.py: status, compaction, quarantine, retention per table, the hourly
utilization rollup of iceberg_rollup.py, snapshot expiry).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.config import LakeSettings
from pipeline.errors import ConfigError, SinkError
from pipeline.lake import iceberg_rollup
from pipeline.lake.columns import TIMESTAMP
from pipeline.lake.tables import TableSpec

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


def _key(path: str) -> str:
    """`s3://bucket/key` → `bucket/key` (pyarrow's S3 paths)."""
    return path.removeprefix("s3://").removeprefix("s3a://")


def _day(data_file: Any) -> str | None:
    """A data file's day partition as YYYY-MM-DD (Iceberg stores days since the epoch)."""
    value = data_file.partition[0] if len(data_file.partition) else None
    if value is None:
        return None
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=int(value))).strftime("%Y-%m-%d")


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
