"""The lake sink takes producers' batch records (pipeline/wire/batches.py): the XID adapter
and the simulator write events.xid that way by default, and the lake's xid table reads it. On
both lake backends (local Parquet, Iceberg on s3proxy: tests/iceberg_fixture.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from pipeline.config import Settings, load_settings
from pipeline.errors import DecodeError
from pipeline.lake.query import Lake
from pipeline.lake.sink import LakeSink
from pipeline.wire.batches import group_by_partition, headers
from pipeline.wire.codec import encode
from pipeline.wire.topics import topic_name
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, iceberg_settings

SETTINGS = load_settings(environ={})
XID_TOPIC = topic_name(SETTINGS.kafka, "events.xid")
# a sink's lake: its folder and the settings (the backend's lake settings)
Stored = tuple[Path, Settings]


@pytest.fixture(params=BACKENDS)
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Stored:
    if request.param == "local":
        return tmp_path, SETTINGS
    return tmp_path, msgspec.structs.replace(SETTINGS, lake=iceberg_settings(tmp_path))


@dataclass
class Record:
    """What the edge runner hands a sink: a consumed record's coordinates, value, headers."""

    topic: str
    partition: int
    offset: int
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=headers)
    key: bytes = b"k"


def _batch(values: list[bytes], offset: int) -> Record:
    [(_, _, packed)] = group_by_partition(
        [("c1/g1", "application/json", v) for v in values], partitions=1
    )
    return Record(XID_TOPIC, 0, offset, packed)


def _xid_rows(lake: Stored) -> list[tuple[object, ...]]:
    with Lake(lake[0], lake[1].lake) as reader:
        return reader.sql("SELECT node, xid, epoch_ms(ts) FROM xid ORDER BY ts").rows


def test_each_value_of_a_batch_record_is_a_row(lake: Stored) -> None:
    sink = LakeSink(lake[1], lake[0])
    sink.add(_batch([encode(x) for x in fx.XIDS[:3]], offset=0))
    sink.add(_batch([encode(x) for x in fx.XIDS[3:]], offset=1))
    sink.flush()
    assert _xid_rows(lake) == [(x.node, x.xid, x.ts) for x in fx.XIDS]
    assert sink.stats.tables == {"xid": len(fx.XIDS)}


def test_a_bad_value_is_named_and_the_good_ones_are_kept(lake: Stored) -> None:
    sink = LakeSink(lake[1], lake[0])
    values = [encode(fx.XIDS[0]), b"not json", encode(fx.XIDS[1]), b'{"schema": "xid_event/1"}']
    with pytest.raises(DecodeError) as raised:
        sink.add(_batch(values, offset=0))  # the edge runner dead-letters the record
    assert str(raised.value).startswith("value 1: $: expected a JSON object")
    assert "2 bad values: 1, 3" in str(raised.value)
    sink.flush()
    assert _xid_rows(lake) == [(x.node, x.xid, x.ts) for x in fx.XIDS[:2]]


def test_a_batch_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    sink = LakeSink(SETTINGS, tmp_path)
    with pytest.raises(DecodeError, match="expected a batch"):
        sink.add(Record(XID_TOPIC, 0, 0, b"\x01garbage"))


UTIL_TOPIC = topic_name(SETTINGS.kafka, "utilization")


def _rows(values: list[bytes], offset: int, partition: int = 0) -> Record:
    """A batch record as the worker writes utilization: JSON rows (kafka.utilization_batch)."""
    packed = msgspec.msgpack.encode([("application/json", value) for value in values])
    return Record(UTIL_TOPIC, partition, offset, packed)


def _utilization(lake: Stored) -> list[tuple[object, ...]]:
    with Lake(lake[0], lake[1].lake) as reader:
        return reader.sql(
            "SELECT node, device, epoch_ms(window_start), util_mean FROM utilization "
            "ORDER BY window_start, node, device").rows


def test_the_worker_s_utilization_batches_are_its_rows(lake: Stored) -> None:
    rows = fx.utilization()
    sink = LakeSink(lake[1], lake[0])
    half = len(rows) // 2
    sink.add(_rows([encode(u) for u in rows[:half]], offset=0))
    sink.add(_rows([encode(u) for u in rows[half:]], offset=0, partition=1))
    sink.flush()
    expected = sorted((u.node, u.device, u.window_start, u.util_mean) for u in rows)
    assert sorted(_utilization(lake)) == expected
    assert sink.stats.tables == {"utilization": len(rows)}


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (lambda raw: raw.replace(b'"schema":"utilization/2",', b""), "$.schema"),
        (lambda raw: raw.replace(b'"samples":', b'"samples":-'), "$.samples"),
        (lambda raw: encode(fx.XIDS[0]), "$.schema: expected 'utilization/2'"),
    ],
)
def test_one_bad_row_in_a_utilization_batch_is_named_and_the_others_kept(
    lake: Stored, bad: Callable[[bytes], bytes], says: str
) -> None:
    rows = fx.utilization()[:5]
    values = [encode(u) for u in rows]
    values[2] = bad(values[2])
    sink = LakeSink(lake[1], lake[0])
    with pytest.raises(DecodeError) as raised:
        sink.add(_rows(values, offset=0))
    assert str(raised.value).startswith(f"value 2: {says}"), str(raised.value)
    sink.flush()
    kept = [rows[i] for i in (0, 1, 3, 4)]
    assert sorted(_utilization(lake)) == sorted(
        (u.node, u.device, u.window_start, u.util_mean) for u in kept)
