"""The lake as Iceberg tables on a real object store (s3proxy, deploy/s3/s3.sh) with a SQLite
catalog: every table from TABLES, day partitions, offsets in snapshot summaries, replays and
concurrent writers without duplicates (on a SQLite and on a PostgreSQL catalog:
deploy/postgres/postgres.sh), compaction and expiry, `lake status`. The canned analyses
run on both backends in tests/unit/test_sql.py (tests/iceberg_fixture.py's BACKENDS)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from pipeline.errors import ConfigError
from pipeline.lake import iceberg, iceberg_ops, iceberg_read
from pipeline.lake.iceberg import arrow_schema, committed_offsets, open_catalog
from pipeline.lake.iceberg_writer import IcebergWriter
from pipeline.lake.query import Lake
from pipeline.lake.tables import TABLES
from pipeline.model import XidEvent
from tests import lake_fixture as fx
from tests.iceberg_fixture import CATALOGS, build_iceberg_lake, iceberg_settings, settings_env

T0 = fx.T0
DAY = 86_400_000


def xid(offset: int, at: int) -> XidEvent:
    return XidEvent(ts=at, cluster="c1", node=f"n{offset}", pool="train", zone="z-a",
                    pci_bus_id="0000:53:00", gpu_index=offset, xid=79, message="NVRM: Xid 79",
                    source="simulator")


def xids(writer: IcebergWriter, partition: int, offsets: range, at: int = T0) -> None:
    for offset in offsets:
        writer.add("xid", xid(offset, at + offset), ("fleet.events.xid", partition, offset))


def count(settings: object, table: str = "xid") -> int:
    with Lake(Path("."), settings) as opened:  # type: ignore[arg-type]
        return int(opened.sql(f"SELECT count(*) FROM stored_{table}").rows[0][0])


def test_every_lake_table_is_an_iceberg_table_of_its_derived_columns_by_day(
    tmp_path: Path,
) -> None:
    settings = build_iceberg_lake(tmp_path)
    catalog = open_catalog(settings)
    for name, spec in TABLES.items():
        table = catalog.load_table(f"{settings.namespace}.{name}")
        assert [f.name for f in table.schema().fields] == spec.schema.names, name
        day, *more = table.spec().fields
        assert str(day.transform) == "day", name
        source = table.schema().find_field(day.source_id).name
        assert source == spec.columns[0].name, name  # the table's time column
        by = [table.schema().find_field(f.source_id).name for f in more]
        assert by == (["cluster"] if name == "utilization" else []), name


@pytest.mark.parametrize("catalog", CATALOGS)
def test_each_append_records_its_offsets_and_a_replay_adds_nothing(tmp_path: Path, catalog: str) -> None:
    settings = iceberg_settings(tmp_path, catalog)
    writer = IcebergWriter(settings)
    xids(writer, 0, range(0, 100))
    xids(writer, 1, range(0, 40))
    assert writer.flush() == {("fleet.events.xid", 0): 100, ("fleet.events.xid", 1): 40}
    table = writer.table("xid")
    assert committed_offsets(table) == {("fleet.events.xid", 0): 100, ("fleet.events.xid", 1): 40}
    # a crash before the Kafka commit: another writer replays from offset 50 and goes on
    again = IcebergWriter(settings)
    xids(again, 0, range(50, 130))
    again.flush()
    assert again.rows_already_in_lake == 50
    assert again.rows_written == 30
    table.refresh()
    assert committed_offsets(table) == {("fleet.events.xid", 0): 130, ("fleet.events.xid", 1): 40}
    assert count(settings) == 170
    with Lake(tmp_path, settings) as opened:
        gpus = opened.sql("SELECT gpu_index FROM stored_xid").rows
    assert sorted(g for (g,) in gpus) == sorted([*range(130), *range(40)])


@pytest.mark.parametrize("catalog", CATALOGS)
def test_writers_racing_on_one_table_each_commit_every_row_once(tmp_path: Path, catalog: str) -> None:
    settings = iceberg_settings(tmp_path, catalog)
    IcebergWriter(settings).table("xid")  # created once, as the first writer would
    errors: list[BaseException] = []
    writers = [IcebergWriter(settings) for _ in range(3)]

    def run(partition: int, writer: IcebergWriter) -> None:
        try:
            for batch in range(5):
                xids(writer, partition, range(batch * 20, batch * 20 + 20))
                writer.flush()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p, w)) for p, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(w.commits for w in writers) == 15
    table = writers[0].table("xid")
    table.refresh()
    assert committed_offsets(table) == {("fleet.events.xid", p): 100 for p in range(3)}
    assert count(settings) == 300


def test_compaction_merges_a_days_files_keeps_rows_and_offsets_and_expires_snapshots(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path, compact_min_files=3, snapshot_keep_s=0,
                                compact_keep_s=0)
    writer = IcebergWriter(settings)
    for batch in range(4):  # four appends into day 0, one into day 1
        xids(writer, 0, range(batch * 10, batch * 10 + 10))
        writer.flush()
    xids(writer, 0, range(40, 45), at=T0 + DAY)
    writer.flush()
    before = {t.name: t for t in iceberg_ops.status(settings)}["xid"]
    assert (before.files, before.rows, before.snapshots) == (5, 45, 5)
    assert count(settings) == 45  # a reader copies the five data files into its cache
    cache = iceberg_read.cache_dir(settings)
    assert len(list(cache.rglob("*.parquet"))) == 5
    assert (before.oldest_day, before.newest_day) == ("2026-01-01", "2026-01-02")

    report = iceberg_ops.compact(settings, now=datetime.now(UTC) + timedelta(seconds=1))
    assert (report.partitions, report.files_merged, report.rows) == (1, 4, 40)
    assert report.cache_files_removed == 4  # the merged ones: no snapshot lists them now
    after = {t.name: t for t in iceberg_ops.status(settings)}["xid"]
    assert (after.files, after.rows, after.snapshots) == (2, 45, 1)
    table = writer.table("xid")
    table.refresh()
    assert committed_offsets(table) == {("fleet.events.xid", 0): 45}
    assert count(settings) == 45
    assert len(list(cache.rglob("*.parquet"))) == 2
    # offsets survive compaction: a replay from the start adds nothing
    xids(writer, 0, range(0, 45))
    writer.flush()
    assert count(settings) == 45


def test_a_column_the_model_adds_is_added_to_the_table_and_old_files_read_it_as_null(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path)
    spec = TABLES["xid"]
    newest = "source"  # as if the model had added it: the table starts without it
    older = [f for f in arrow_schema(spec) if f.name != newest]
    catalog = open_catalog(settings)
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(pa.schema(older)))
    table = catalog.create_table(f"{settings.namespace}.xid", schema=schema)
    rows = spec.to_arrow([xid(n, T0 + n) for n in range(5)]).cast(arrow_schema(spec))
    table.append(rows.drop_columns([newest]))
    writer = IcebergWriter(settings)  # a sink of the newer version starts
    assert newest in [f.name for f in writer.table("xid").schema().fields]
    xids(writer, 0, range(5, 8))
    writer.flush()
    with Lake(tmp_path, settings) as opened:
        got = opened.sql(f'SELECT "{newest}" IS NULL, count(*) FROM stored_xid GROUP BY 1 '
                         "ORDER BY 1").rows
    assert got == [(False, 3), (True, 5)]


def test_lake_status_compact_sql_and_report_commands_work_on_the_iceberg_tables(tmp_path: Path) -> None:
    settings = build_iceberg_lake(tmp_path)
    env = {**os.environ, **settings_env(settings)}
    status = subprocess.run([sys.executable, "-m", "pipeline.cli", "lake", "status"],
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert status.returncode == 0, status.stderr
    line = next(line for line in status.stdout.splitlines() if line.startswith("utilization "))
    assert str(len(fx.utilization())) in line.split()
    assert "2026-01-01 .. 2026-01-01" in line
    sql = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sql", "--format", "csv",
         "SELECT count(*) AS n FROM findings"],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert sql.returncode == 0, sql.stderr
    assert sql.stdout.split() == ["n", str(len(fx.FINDINGS))]
    compact = subprocess.run([sys.executable, "-m", "pipeline.cli", "lake", "compact"],
                             env=env, capture_output=True, text=True, timeout=120, check=False)
    assert compact.returncode == 0, compact.stderr
    assert compact.stdout.startswith("0 day partitions: merged 0 files"), compact.stdout
    out = tmp_path / "report.html"
    report = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--out", str(out),
         "--until", "2026-01-01T04:00Z", "--since", "4h"],
        env=env, capture_output=True, text=True, timeout=180, check=False)
    assert report.returncode == 0, report.stderr
    assert "g1" in out.read_text()  # the fixture's failing node, from the Iceberg tables


@pytest.mark.parametrize("how", fx.DAMAGES)
def test_a_damaged_cached_copy_is_left_out_and_named_and_the_rest_is_read(
    tmp_path: Path, how: str
) -> None:
    settings = iceberg_settings(tmp_path)
    writer = IcebergWriter(settings)
    for batch in range(3):  # three data files
        xids(writer, 0, range(batch * 10, batch * 10 + 10))
        writer.flush()
    assert count(settings) == 30  # copies every file into the cache
    (victim, *_) = sorted(iceberg_read.cache_dir(settings).rglob("*.parquet"))
    fx.damage(victim, how)
    with Lake(tmp_path, settings) as opened:
        # a query reads the pages (a count alone comes from the footers)
        assert opened.sql("SELECT count(DISTINCT node) FROM stored_xid").rows == [(20,)]
        assert list(opened.skipped) == [victim]


def test_a_catalog_that_cannot_be_opened_is_a_config_error_naming_the_setting(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path)
    missing = tmp_path / "no-such-folder" / "catalog.db"
    broken = msgspec.structs.replace(settings, catalog=f"sqlite:///{missing}")
    with pytest.raises(ConfigError, match=r"lake\.catalog .*cannot open the Iceberg catalog"):
        open_catalog(broken)


def test_the_s3_client_is_told_to_send_checksums_only_when_required() -> None:
    iceberg.configure_s3_client()
    assert os.environ["AWS_REQUEST_CHECKSUM_CALCULATION"] in {"WHEN_REQUIRED", "when_required"}
    assert os.environ["AWS_RESPONSE_CHECKSUM_VALIDATION"] in {"WHEN_REQUIRED", "when_required"}
