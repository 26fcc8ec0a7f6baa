"""Operations on the Iceberg lake (docs/lake-iceberg.md, "Operations"), on s3proxy: the hourly
utilization rollup `lake compact` keeps and long canned ranges read, and per-table retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from pipeline.config import LakeSettings
from pipeline.lake import iceberg, iceberg_ops, iceberg_read, iceberg_rollup
from pipeline.lake.iceberg import committed_offsets, open_catalog
from pipeline.lake.iceberg_writer import IcebergWriter
from pipeline.lake.query import Lake, canned_queries
from pipeline.model import XidEvent
from tests import lake_fixture as fx
from tests.iceberg_fixture import iceberg_settings

DAY_MS = 86_400_000
TOPIC = "fleet.utilization"
START = datetime(2026, 1, 1)
FLOATS = ("device_hours", "util_hours", "util_max", "mem_hours")


def days_of_utilization(writer: IcebergWriter, days: range, *, offset: int = 0,
                        minutes: int | None = None) -> int:
    """The fixture's utilization rows (4 hours) on each of `days` (one commit per day);
    `minutes`: only the first windows of each. The next offset."""
    rows = [r for r in fx.utilization()
            if minutes is None or r.window_start < fx.T0 + minutes * 60_000]
    for day in days:
        shifted = [msgspec.structs.replace(r, window_start=r.window_start + day * DAY_MS)
                   for r in rows]
        writer.extend("utilization", shifted, TOPIC, 0, range(offset, offset + len(shifted)))
        writer.flush()
        offset += len(shifted)
    return offset


def rollup_rows(settings: LakeSettings) -> list[dict[str, object]]:
    found = iceberg.rollup_table(open_catalog(settings), settings, create=False)
    assert found is not None
    rows = found.scan().to_arrow().drop_columns(["day_rows"]).to_pylist()
    return sorted(rows, key=_order)


def raw_hourly(settings: LakeSettings) -> list[dict[str, object]]:
    """The hourly aggregation of the raw rows, computed by DuckDB over the reader's views."""
    with Lake(Path("."), settings) as lake:
        result = lake.sql(iceberg_rollup.HOURLY_SQL.format(source="utilization"))
    return sorted(result.records(), key=_order)


def _order(row: dict[str, object]) -> tuple[str, ...]:
    return tuple(str(row[k]) for k in ("hour", "cluster", "pool", "zone", "accelerator",
                                       "allocated"))


def assert_same(got: list[dict[str, object]], want: list[dict[str, object]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert {k: v for k, v in a.items() if k not in FLOATS} == \
            {k: v for k, v in b.items() if k not in FLOATS}
        for k in FLOATS:
            assert a[k] == pytest.approx(b[k], rel=1e-12), k


def timeline(settings: LakeSettings, *, rollup: bool, until: datetime,
             since: datetime = START) -> list[tuple[object, ...]]:
    """utilization_timeline by pool over since..until, per 6 hours; through the rollup (the
    canned query's own path for a long range) or over the raw rows (its SQL run as written)."""
    params = {"since": since, "until": until, "bucket": timedelta(hours=6), "by": "pool"}
    with Lake(Path("."), settings) as lake:
        if rollup:
            rows = lake.run("utilization_timeline", **params).rows
            assert "utilization_hourly" in lake.views()  # the long range read the rollup
            return rows
        query = canned_queries()["utilization_timeline"]
        return lake.sql(query.sql, lake.bind(query, params)).rows


def test_compaction_rolls_utilization_up_by_hour_and_long_ranges_read_the_rollup(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path, rollup_min_range_s=86_400)
    writer = IcebergWriter(settings)
    offset = days_of_utilization(writer, range(3))
    now = datetime.now(UTC)
    report = iceberg_ops.compact(settings, now=now)
    assert (report.rollup_days, report.rollup_rows) == (3, len(rollup_rows(settings)))
    assert report.rollup_rows > 0
    assert_same(rollup_rows(settings), raw_hourly(settings))  # the rollup = the raw rows summed
    until = START + timedelta(days=3)
    raw = timeline(settings, rollup=False, until=until)
    assert timeline(settings, rollup=True, until=until) == raw
    assert len({row[0] for row in raw}) == 3  # one 6-hour bucket of data a day
    # a range that starts and ends within hours: whole hours from the rollup, the rest raw
    since, odd = START + timedelta(minutes=25), START + timedelta(days=2, hours=2, minutes=10)
    assert timeline(settings, rollup=True, since=since, until=odd) == \
        timeline(settings, rollup=False, since=since, until=odd)
    assert timeline(settings, rollup=True, since=since, until=odd) != raw

    # late rows for day 1, not rolled up yet: that day is read raw, the answer stays right
    offset = days_of_utilization(writer, range(1, 2), offset=offset, minutes=30)
    assert timeline(settings, rollup=True, until=until) == timeline(settings, rollup=False,
                                                                     until=until)
    assert timeline(settings, rollup=True, until=until) != raw
    again = iceberg_ops.compact(settings, now=now)
    assert again.rollup_days == 1  # only the day that changed
    assert_same(rollup_rows(settings), raw_hourly(settings))
    assert iceberg_ops.compact(settings, now=now).rollup_days == 0
    status = {t.name: t for t in iceberg_ops.status(settings)}["utilization_hourly"]
    assert (status.rows, status.oldest_day, status.newest_day) == (
        len(rollup_rows(settings)), "2026-01-01", "2026-01-03")


def test_retention_drops_old_day_partitions_per_table_and_keeps_offsets_and_rollup(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path, rollup_min_range_s=86_400,
                                retention_days={"utilization": 2})
    writer = IcebergWriter(settings)
    offset = days_of_utilization(writer, range(3))
    iceberg_ops.compact(settings, now=datetime(2026, 1, 3, tzinfo=UTC))  # nothing old enough
    until = START + timedelta(days=3)
    before = timeline(settings, rollup=True, until=until)
    table = writer.table("utilization")
    table.refresh()
    first_day = [t.file for t in table.scan().plan_files() if iceberg._day(t.file) == "2026-01-01"]
    assert first_day

    # two days kept on 2026-01-04: 2026-01-02 and later; the xid table has no retention
    report = iceberg_ops.compact(settings, now=datetime(2026, 1, 4, 12, tzinfo=UTC))
    assert report.files_dropped == len(first_day)
    status = {t.name: t for t in iceberg_ops.status(settings)}["utilization"]
    assert (status.oldest_day, status.newest_day) == ("2026-01-02", "2026-01-03")
    assert status.rows == 2 * len(fx.utilization())
    table.refresh()
    assert committed_offsets(table) == {(TOPIC, 0): offset}
    # the rollup keeps the dropped day: a long range still counts it
    assert timeline(settings, rollup=True, until=until) == before
    # snapshots expired (the ones with offsets before the drop gone): a replay adds nothing
    expire = msgspec.structs.replace(settings, retention_days={}, snapshot_keep_s=0)
    assert iceberg_ops.compact(expire, now=datetime.now(UTC) + timedelta(seconds=1)
                           ).snapshots_expired > 0
    replay = IcebergWriter(settings)
    days_of_utilization(replay, range(3))
    assert (replay.rows_written, replay.rows_already_in_lake) == (0, offset)


@pytest.mark.parametrize("setting", ["retention_days", "snapshot_keep_s_by_table"])
def test_a_retention_setting_naming_no_table_is_a_config_error(tmp_path: Path,
                                                              setting: str) -> None:
    from pipeline.errors import ConfigError

    settings = iceberg_settings(tmp_path, **{setting: {"utilisation": 1}})
    with pytest.raises(ConfigError, match=rf"lake\.{setting}: unknown table utilisation"):
        iceberg_ops.compact(settings, now=datetime.now(UTC))


def test_a_reader_given_a_range_fetches_only_those_days_and_widens_for_a_query_outside(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path)
    writer = IcebergWriter(settings)
    days_of_utilization(writer, range(3))
    table = writer.table("utilization")
    table.refresh()
    by_day = {day: {iceberg._key(t.file.file_path) for t in table.scan().plan_files()
                    if iceberg._day(t.file) == day}
              for day in ("2026-01-01", "2026-01-02", "2026-01-03")}
    cache = iceberg_read.cache_dir(settings)

    def cached() -> set[str]:
        return {p.relative_to(cache).as_posix() for p in cache.rglob("*.parquet")}

    day1 = (START + timedelta(days=1), START + timedelta(days=2))
    with Lake(Path("."), settings, fetch_range=day1) as lake:
        assert cached() == by_day["2026-01-02"]  # only the day asked for
        pruned = lake.run("fleet_summary", since=day1[0], until=day1[1]).rows
        assert cached() == by_day["2026-01-02"]
        # a range reaching outside the fetched days: the rest is fetched, the answer is whole
        wide = lake.run("fleet_summary", since=START, until=day1[1]).rows
        assert cached() == set().union(*by_day.values())
    with Lake(Path("."), settings) as whole:
        assert whole.run("fleet_summary", since=day1[0], until=day1[1]).rows == pruned
        assert whole.run("fleet_summary", since=START, until=day1[1]).rows == wide
    assert pruned != wide


def xids(writer: IcebergWriter, offsets: range, at: int = fx.T0) -> None:
    for n in offsets:
        event = XidEvent(ts=at + n, cluster="c1", node=f"n{n}", pool="train", zone="z-a",
                         pci_bus_id="0000:53:00", gpu_index=n, xid=79, message="NVRM: Xid 79",
                         source="simulator")
        writer.add("xid", event, ("fleet.events.xid", 0, n))


def xid_keys(writer: IcebergWriter) -> list[str]:
    table = writer.table("xid")
    table.refresh()
    return sorted(iceberg._key(t.file.file_path) for t in table.scan().plan_files())


def damage_object(settings: LakeSettings, key: str, how: str, folder: Path) -> None:
    """Break an object in the bucket the way tests/lake_fixture.py breaks a local file."""
    filesystem = iceberg.s3_filesystem(settings)
    local = folder / "victim.parquet"
    with filesystem.open_input_stream(key) as source:
        local.write_bytes(source.read())
    fx.damage(local, how)
    with filesystem.open_output_stream(key) as out:
        out.write(local.read_bytes())


def test_an_object_gone_from_the_bucket_is_named_and_left_out_and_the_rest_read(
    tmp_path: Path,
) -> None:
    settings = iceberg_settings(tmp_path)
    writer = IcebergWriter(settings)
    for batch in range(3):
        xids(writer, range(batch * 10, batch * 10 + 10))
        writer.flush()
    victim, *_ = xid_keys(writer)
    iceberg.s3_filesystem(settings).delete_file(victim)
    with Lake(Path("."), settings) as lake:
        assert lake.sql("SELECT count(DISTINCT node) FROM stored_xid").rows == [(20,)]
        (named, why), = lake.skipped.items()
    assert named == iceberg_read.cache_dir(settings) / victim
    assert why.startswith(f"cannot fetch s3://{victim}")


@pytest.mark.parametrize("how", ["corrupt", "damaged pages"])
def test_compaction_quarantines_an_unreadable_object_and_the_table_reads_the_rest(
    tmp_path: Path, how: str
) -> None:
    settings = iceberg_settings(tmp_path, compact_min_files=3)
    writer = IcebergWriter(settings)
    for batch in range(4):  # four small files of one day
        xids(writer, range(batch * 10, batch * 10 + 10))
        writer.flush()
    victim = xid_keys(writer)[1]
    damage_object(settings, victim, how, tmp_path)
    report = iceberg_ops.compact(settings, ["xid"], now=datetime.now(UTC))
    (key, why), = report.quarantined
    target = iceberg_ops.quarantine_key(settings, victim)
    assert key == victim and f"a copy is at s3://{target}" in why
    assert target.startswith(iceberg._key(settings.uri) + "/_quarantine/")
    filesystem = iceberg.s3_filesystem(settings)
    assert filesystem.get_file_info(target).size == filesystem.get_file_info(victim).size
    assert (report.files_merged, report.rows) == (3, 30)  # the other three, merged
    assert victim not in xid_keys(writer)
    table = writer.table("xid")
    assert committed_offsets(table) == {("fleet.events.xid", 0): 40}  # not replayed
    fresh = msgspec.structs.replace(settings, cache_path=str(tmp_path / "fresh-cache"))
    with Lake(Path("."), fresh) as lake:  # another engine's view: the rest, nothing skipped
        assert lake.sql("SELECT count(DISTINCT node) FROM stored_xid").rows == [(30,)]
        assert lake.skipped == {}


def test_compact_verify_reads_every_file_and_quarantines_damaged_pages(tmp_path: Path) -> None:
    settings = iceberg_settings(tmp_path)  # compact_min_files 4: nothing merged here
    writer = IcebergWriter(settings)
    for batch in range(2):
        xids(writer, range(batch * 10, batch * 10 + 10))
        writer.flush()
    victim = xid_keys(writer)[0]
    damage_object(settings, victim, "damaged pages", tmp_path)
    assert iceberg_ops.compact(settings, ["xid"], now=datetime.now(UTC)).quarantined == []
    report = iceberg_ops.compact(settings, ["xid"], now=datetime.now(UTC), verify=True)
    assert [key for key, _ in report.quarantined] == [victim]
    assert len(xid_keys(writer)) == 1
