"""LakeWriter: layout, flattening, atomic replay-safe files, schema evolution."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline.lake.writer as lake_module
from pipeline.config import LakeSettings
from pipeline.errors import SinkError
from pipeline.lake import tables as lake_tables
from pipeline.lake.query import Lake
from pipeline.lake.tables import TABLES, TableSpec, table_for_event
from pipeline.lake.writer import LakeWriter, read_committed, visible_files
from pipeline.model import Event, Utilization, XidEvent
from tests import lake_fixture as fx

HOUR = fx.HOUR


def xid_at(offset: int, hour: int) -> XidEvent:
    """An XID event that carries its own offset (pid), so a test can tell rows apart."""
    return XidEvent(ts=fx.T0 + hour * HOUR + offset, cluster="c1", node="g1", pool="train",
                    zone="z-a", pci_bus_id="0000:53:00", xid=79, pid=offset, message="m",
                    source="simulator")


def pids(root: Path) -> list[int]:
    files = visible_files(root, "xid")
    if not files:
        return []
    return sorted(pq.read_table(files, columns=["pid"]).column("pid").to_pylist())


def test_files_are_partitioned_by_event_hour_and_named_by_partition_and_first_offset(
    tmp_path: Path,
) -> None:
    writer = LakeWriter(tmp_path, LakeSettings(row_group_rows=2))
    for offset in range(5):
        writer.add("xid", xid_at(offset, hour=offset % 2), ("fleet.events.xid", 3, 100 + offset))
    assert writer.pending_rows == 5
    assert writer.flush() == {("fleet.events.xid", 3): 105}
    names = sorted(str(p.relative_to(tmp_path)) for p in visible_files(tmp_path, "xid"))
    assert names == ["xid/date=2026-01-01/hour=00/fleet.events.xid-3-100.parquet",
                     "xid/date=2026-01-01/hour=01/fleet.events.xid-3-101.parquet"]
    parquet = pq.ParquetFile(tmp_path / names[0])
    assert parquet.metadata.num_rows == 3 and parquet.metadata.num_row_groups == 2
    assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    meta = parquet.schema_arrow.metadata
    assert meta[b"fleetpulse.first_offset"] == b"100" and meta[b"fleetpulse.last_offset"] == b"104"
    assert not list(tmp_path.rglob("*.tmp"))


def test_nested_structs_flatten_into_columns_lists_and_maps(tmp_path: Path) -> None:
    writer = LakeWriter(tmp_path, LakeSettings())
    for table in ("findings", "actions", "alerts", "capacity"):
        for offset, event in enumerate(fx.EVERYTHING[table]()):
            assert table_for_event(event) == table
            writer.add(table, event, (table, 0, offset))
    writer.flush()
    findings = pq.read_table(visible_files(tmp_path, "findings"), partitioning=None).to_pylist()
    first = fx.FINDINGS[0]
    row = next(r for r in findings if r["finding_id"] == first.finding_id)
    assert (row["target_cluster"], row["target_kind"], row["target_name"], row["target_pool"],
            row["target_zone"]) == ("c1", "node", "g1", "train", "z-a")
    assert row["evidence_score"] == 5.0 and row["schema"] == "finding/2"
    actions = pq.read_table(visible_files(tmp_path, "actions")).to_pylist()
    assert actions[0]["reason_checks"] == ["xid"]
    alert = pq.read_table(visible_files(tmp_path, "alerts")).to_pylist()[0]
    assert alert["alertname"] == "NodeCordoned" and ("node", "g1") in alert["labels"]
    capacity = pq.read_table(visible_files(tmp_path, "capacity")).to_pylist()
    stockout = next(r for r in capacity if r["kind"] == "STOCKOUT")
    assert stockout["quota_limit"] is None and stockout["window_start"] is None
    quota = next(r for r in capacity if r["kind"] == "QUOTA_USAGE")
    assert quota["quota_limit"] == fx.QUOTA_LIMIT


def test_every_table_has_a_topic_and_a_timestamp_column() -> None:
    for spec in TABLES.values():
        assert spec.schema.names[0] in ("ts", "window_start")
        assert spec.schema.field(0).type == pa.timestamp("ms")


def test_bad_input_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    writer = LakeWriter(tmp_path, LakeSettings())
    with pytest.raises(SinkError, match="unknown table 'nope'"):
        writer.add("nope", xid_at(0, 0), ("t", 0, 0))
    with pytest.raises(SinkError, match="takes Finding, got XidEvent"):
        writer.add("findings", xid_at(0, 0), ("t", 0, 0))
    with pytest.raises(SinkError, match="bad source"):
        writer.add("xid", xid_at(0, 0), ("../../etc", 0, 0))


class CrashError(Exception):
    """Stands for the process dying in the middle of a flush."""


def _crash_after(monkeypatch: pytest.MonkeyPatch, renames: int) -> None:
    real = lake_module.write_atomically
    calls = {"n": 0}

    def write(path: Path, body: object) -> None:
        if calls["n"] >= renames:
            raise CrashError
        calls["n"] += 1
        real(path, body)  # type: ignore[arg-type]

    monkeypatch.setattr(lake_module, "write_atomically", write)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hours=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    committed_batches=st.lists(st.integers(1, 15), max_size=3),
    crashed_batch=st.integers(1, 30),
    renames_before_crash=st.integers(0, 5),
    replay_batches=st.lists(st.integers(1, 20), min_size=1, max_size=6),
)
def test_a_replay_after_a_crash_overwrites_and_never_duplicates(
    tmp_path_factory: pytest.TempPathFactory,
    hours: list[int],
    committed_batches: list[int],
    crashed_batch: int,
    renames_before_crash: int,
    replay_batches: list[int],
) -> None:
    root = tmp_path_factory.mktemp("lake")
    events = [xid_at(offset, hour) for offset, hour in enumerate(hours)]
    source = ("fleet.events.xid", 0)
    position = 0
    writer = LakeWriter(root, LakeSettings())
    for size in committed_batches:  # batches flushed, then committed
        for event in events[position : position + size]:
            writer.add("xid", event, (*source, event.pid or 0))
        position = min(len(events), position + size)
        writer.mark_committed(writer.flush())
    # a batch that crashes part-way through its flush: some files renamed, nothing committed
    for event in events[position : position + crashed_batch]:
        writer.add("xid", event, (*source, event.pid or 0))
    with pytest.MonkeyPatch.context() as patch:
        _crash_after(patch, renames_before_crash)
        with contextlib.suppress(CrashError):
            writer.flush()
    # restart: a new writer resumes from the committed offset, with other batch boundaries
    resume = read_committed(root).get(source, 0)
    assert resume == position
    writer = LakeWriter(root, LakeSettings())
    for size in [*replay_batches, len(events)]:
        for event in events[resume : resume + size]:
            writer.add("xid", event, (*source, event.pid or 0))
        resume = min(len(events), resume + size)
        writer.mark_committed(writer.flush())
    assert pids(root) == list(range(len(events)))


def test_old_files_without_new_columns_still_read(tmp_path: Path) -> None:
    rows = [row for row in fx.utilization() if row.slice is None][:20]  # all with power
    writer = LakeWriter(tmp_path, LakeSettings())
    for offset, row in enumerate(rows[:10]):
        writer.add("utilization", row, ("u", 0, offset))
    writer.flush()
    # an "old version" file: the same table before power_w_mean and mem_used_frac existed
    table = TABLES["utilization"].to_arrow(rows[10:])
    table = table.drop_columns(["power_w_mean", "mem_used_frac"])
    old = next(iter(visible_files(tmp_path, "utilization"))).with_name("u-1-0.parquet")
    pq.write_table(table, old)
    with Lake(tmp_path) as lake:
        result = lake.sql("SELECT count(*), count(power_w_mean), count(mem_used_frac), "
                          "sum(hours) FROM utilization")
    assert result.rows == [(20, 10, 10, 20 / 60)]


def test_the_gpu_a_reset_is_for_lands_in_the_actions_table(tmp_path: Path) -> None:
    import msgspec

    writer = LakeWriter(tmp_path, LakeSettings())
    action = fx.EVERYTHING["actions"]()[0]
    reset = msgspec.structs.replace(action, kind="reset_gpu", device="0,3")
    writer.add("actions", reset, ("actions", 0, 0))
    writer.flush()
    rows = pq.read_table(visible_files(tmp_path, "actions")).to_pylist()
    assert [(r["kind"], r["device"]) for r in rows] == [("reset_gpu", "0,3")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hours=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    split=st.integers(0, 40),
)
def test_a_batch_through_extend_writes_the_same_files_as_one_add_per_record(
    tmp_path_factory: pytest.TempPathFactory, hours: list[int], split: int
) -> None:
    events = [xid_at(offset, hour) for offset, hour in enumerate(hours)]
    offsets = [10 + offset for offset in range(len(events))]
    one_by_one, batched = tmp_path_factory.mktemp("add"), tmp_path_factory.mktemp("extend")
    writer = LakeWriter(one_by_one, LakeSettings())
    for event, offset in zip(events, offsets, strict=True):
        writer.add("xid", event, ("fleet.events.xid", 2, offset))
    expected = writer.flush()
    writer = LakeWriter(batched, LakeSettings())
    writer.extend("xid", events[:split], "fleet.events.xid", 2, offsets[:split])
    writer.extend("xid", events[split:], "fleet.events.xid", 2, offsets[split:])
    assert writer.flush() == expected == {("fleet.events.xid", 2): 10 + len(events)}

    def files(root: Path) -> dict[str, list[int]]:
        return {str(p.relative_to(root)): pq.read_table(p).column("pid").to_pylist()
                for p in visible_files(root, "xid")}

    assert files(batched) == files(one_by_one)
    assert sorted(pid for pids_ in files(batched).values() for pid in pids_) == list(
        range(len(events)))


def test_a_failed_flush_keeps_what_it_did_not_write_and_later_rows_join_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = LakeWriter(tmp_path, LakeSettings())
    for offset in range(4):
        writer.add("xid", xid_at(offset, hour=offset % 2), ("fleet.events.xid", 0, offset))
    real = lake_module.write_parquet
    calls = {"n": 0}

    def full_after_one(path: Path, table: pa.Table, settings: LakeSettings) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(path, table, settings)

    monkeypatch.setattr(lake_module, "write_parquet", full_after_one)
    with pytest.raises(SinkError, match="No space left"):
        writer.flush()
    writer.add("xid", xid_at(4, hour=1), ("fleet.events.xid", 0, 4))  # fetched meanwhile
    assert writer.flush() == {("fleet.events.xid", 0): 5}
    names = sorted(p.name for p in visible_files(tmp_path, "xid"))
    assert names == ["fleet.events.xid-0-0.parquet", "fleet.events.xid-0-1.parquet"]
    assert pids(tmp_path) == [0, 1, 2, 3, 4]


def test_extend_refuses_what_add_refuses(tmp_path: Path) -> None:
    writer = LakeWriter(tmp_path, LakeSettings())
    with pytest.raises(SinkError, match="takes XidEvent, got Finding"):
        writer.extend("xid", [xid_at(0, 0), fx.FINDINGS[0]], "t", 0, [0, 1])
    with pytest.raises(SinkError, match="bad source"):
        writer.extend("xid", [xid_at(0, 0)], "t", 0, [-1])
    with pytest.raises(SinkError, match="1 events but 2 offsets"):
        writer.extend("xid", [xid_at(0, 0)], "t", 0, [0, 1])
    assert writer.flush() == {}


def _reference_arrow(spec: TableSpec, events: list[Event]) -> pa.Table:
    """The plainest conversion: every column read from every event by its own getter."""
    arrays = [pa.array(list(map(c.get, events)), type=c.type) for c in spec.columns]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


UTILIZATION_ROWS = st.builds(
    Utilization, window_start=st.integers(fx.T0, fx.END), window_s=st.sampled_from([60, 300]),
    cluster=st.just("c1"), pool=st.sampled_from(["train", "serve"]), zone=st.just("z-a"),
    node=st.sampled_from(["g1", "g2", "g-7"]), slice=st.none() | st.just("s1"),
    device=st.sampled_from(["0", "7", "chip-3", "gpü-1"]), accelerator=st.just("NVIDIA H100"),
    job=st.none() | st.just("job-1"), allocated=st.booleans(),
    util_mean=st.floats(0, 100), util_max=st.floats(0, 100), mem_used_frac=st.floats(0, 1),
    power_w_mean=st.none() | st.floats(0, 1000), samples=st.integers(1, 2**31 - 1),
)


@settings(max_examples=60, deadline=None)
@given(
    table=st.sampled_from(sorted(TABLES)),
    picks=st.lists(st.integers(0, 1000), max_size=12),
    utilization=st.lists(UTILIZATION_ROWS, max_size=12),
    chunk=st.integers(1, 5),  # batches span several conversion chunks
)
def test_the_fast_conversion_builds_the_same_columns_as_one_getter_per_column(
    table: str, picks: list[int], utilization: list[Utilization], chunk: int
) -> None:
    # the fixture's lake holds no snapshots (capacity over it is the fold's): two of our own
    known: list[Event] = list(fx.EVERYTHING[table]()) or [
        fx.snapshot(fx.T0, "us-central1-a", 3), fx.snapshot(fx.T0, "us-east5-a", 0, quota=False)]
    events = (list(utilization) if table == "utilization"
              else [known[i % len(known)] for i in picks])
    spec = TABLES[table]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lake_tables, "CHUNK_ROWS", chunk)
        got = spec.to_arrow(events)
    expected = _reference_arrow(spec, events)
    assert got.schema == expected.schema
    assert got.equals(expected, check_metadata=True)


def test_the_fast_conversion_serves_the_tables_whose_fields_are_all_columns() -> None:
    # utilization is the lake's volume table: it must not fall back to the slower path
    assert TABLES["utilization"]._rows_type is not None
    assert TABLES["findings"]._rows_type is None  # nested structs: column by column
