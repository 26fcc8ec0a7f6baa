"""Batch records (pipeline/wire/batches.py), the worker's fleet-input ones and producers'
telemetry ones: what goes in comes out, in order, split where a record would grow too big; a
malformed batch is a clear DecodeError; a value lands in its own key's partition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import KafkaSettings, SimSettings
from pipeline.errors import DecodeError
from pipeline.model import Event
from pipeline.sim import Simulation
from pipeline.wire.batches import (
    BATCH_HEADER,
    PRODUCER_BATCHED,
    Batches,
    group_by_partition,
    input_records,
    is_batch,
    partition_of,
    unpack,
)
from pipeline.wire.codec import decode
from pipeline.wire.topics import TOPICS, record_key, topic_name

Item = tuple[str, str, bytes]  # (key, content type, value)


def _taken(batches: Batches) -> dict[str, list[tuple[str, bytes]]]:
    out: dict[str, list[tuple[str, bytes]]] = {}
    for topic, key, packed in batches.take():
        assert topic == "fleet-input"
        out.setdefault(key, []).extend(unpack(packed))
    return out


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["c1", "c2"]),
            st.sampled_from(["application/json", "application/msgpack"]),
            st.binary(max_size=64),
        ),
        max_size=60,
    )
)
def test_every_value_comes_out_once_in_its_keys_order(items: list[Item]) -> None:
    batches = Batches(max_items=7, max_bytes=300)
    for key, content_type, value in items:
        batches.add("fleet-input", key, value, content_type)
    expected: dict[str, list[tuple[str, bytes]]] = {}
    for key, content_type, value in items:
        expected.setdefault(key, []).append((content_type, value))
    assert _taken(batches) == expected
    assert list(batches.take()) == []  # taken: the next flush starts empty


def test_a_batch_is_split_before_it_passes_the_limits() -> None:
    batches = Batches(max_items=3, max_bytes=1000)
    for i in range(7):
        batches.add("fleet-input", "c1", bytes([i]) * 10, "application/msgpack")
    sizes = [len(unpack(packed)) for _, _, packed in batches.take()]
    assert sizes == [3, 3, 1]
    batches = Batches(max_items=100, max_bytes=150)  # 2 values of 40 bytes and their framing
    for i in range(4):
        batches.add("fleet-input", "c1", bytes([i]) * 40, "application/msgpack")
    assert [len(unpack(packed)) for _, _, packed in batches.take()] == [2, 2]


def test_cleared_values_are_never_written() -> None:
    batches = Batches()
    batches.add("fleet-input", "c1", b"x", "application/json")
    batches.clear()
    assert list(batches.take()) == []


@pytest.mark.parametrize("raw", [None, b"\xc1", b"\x92\x01\x02", b"\x91\x92\xa1a\x01"])
def test_a_malformed_batch_is_a_decode_error_saying_what_a_batch_is(raw: bytes | None) -> None:
    with pytest.raises(DecodeError, match="batch"):
        unpack(raw)


def test_only_records_with_the_header_are_batches() -> None:
    class Record:
        def __init__(self, headers: object) -> None:
            self.headers = headers

    assert is_batch(Record([(BATCH_HEADER, b"1")]))
    assert is_batch(Record({BATCH_HEADER: b"1"}))
    assert not is_batch(Record([("content-type", b"application/msgpack")]))
    assert not is_batch(Record(None))


# --- batches a producer writes on the telemetry topics: many keys, one partition ------------

KEYS = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=40)


@given(key=KEYS, partitions=st.integers(1, 64))
def test_a_key_s_partition_is_the_one_the_worker_s_kafka_client_picks(
    key: str, partitions: int
) -> None:
    # partition_of is kafka-python's murmur2 (the ingest adapters' producer); the worker
    # produces with aiokafka: a batched value must land where a record of its own would have
    from aiokafka.partitioner import DefaultPartitioner

    every = list(range(partitions))
    assert DefaultPartitioner()(key.encode(), every, every) == partition_of(key, partitions)


@given(
    st.lists(
        st.tuples(KEYS, st.sampled_from(["application/msgpack"]), st.binary(max_size=64)),
        max_size=80,
    ),
    st.integers(1, 6),
)
def test_grouped_values_come_out_once_each_in_its_key_s_partition_in_order(
    items: list[Item], partitions: int
) -> None:
    out: dict[int, list[tuple[str, bytes]]] = {}
    for partition, key, packed in group_by_partition(items, partitions, max_items=5):
        assert partition_of(key, partitions) == partition  # the record's key is one of its own
        values = unpack(packed)
        assert 0 < len(values) <= 5
        out.setdefault(partition, []).extend(values)
    expected: dict[int, list[tuple[str, bytes]]] = {}
    for key, content_type, value in items:
        expected.setdefault(partition_of(key, partitions), []).append((content_type, value))
    assert out == expected


_SUFFIX = {spec.value: spec.suffix for spec in TOPICS}
TOPIC_OF = {topic_name(KafkaSettings(), spec.suffix): spec.value for spec in TOPICS}


def topic_suffix(event: Event) -> str:
    return _SUFFIX[type(event)]


def _tick_events() -> list[Event]:
    sim = Simulation(SimSettings(duration_s=120, gpu_nodes=6, tpu_slices=1, seed=5))
    events: list[Event] = []
    for tick in sim.ticks():
        events += tick
    return events


def test_producers_write_a_record_per_event_when_not_batching() -> None:
    events = _tick_events()
    records = input_records(events, KafkaSettings(partitions=3, telemetry_batch=False))
    assert [r.key for r in records] == [record_key(e) for e in events]
    assert {r.partition for r in records} == {None}
    assert not any(is_batch(r) for r in records)


def test_batched_telemetry_keeps_every_value_in_its_key_s_partition_and_order() -> None:
    events = _tick_events()
    settings = KafkaSettings(partitions=3)  # batching is the default
    records = input_records(events, settings)
    batched = [r for r in records if is_batch(r)]
    # the telemetry is batched, the other inputs (inventory, events) go one record each
    telemetry = [e for e in events if topic_suffix(e) in PRODUCER_BATCHED]
    assert telemetry and len(batched) < len(telemetry)
    assert len(records) - len(batched) == len(events) - len(telemetry)
    got: dict[tuple[str, int], list[Event]] = {}
    for record in batched:
        assert record.partition is not None
        assert partition_of(record.key, 3) == record.partition
        values = [decode(v, TOPIC_OF[record.topic], content_type=c) for c, v in unpack(record.value)]
        assert {partition_of(record_key(v), 3) for v in values} == {record.partition}
        got.setdefault((record.topic, record.partition), []).extend(values)
    expected: dict[tuple[str, int], list[Event]] = {}
    for e in telemetry:
        topic = topic_name(settings, topic_suffix(e))
        expected.setdefault((topic, partition_of(record_key(e), 3)), []).append(e)
    assert got == expected


def test_batched_telemetry_follows_the_topic_s_own_partition_count() -> None:
    """A topic made with another count than `kafka.partitions`: the producer asks the broker,
    and each value still goes where a record of its own would."""
    events = _tick_events()
    settings = KafkaSettings(partitions=3, telemetry_batch=True)
    asked: list[str] = []

    def five(topic: str) -> int:
        asked.append(topic)
        return 5

    batched = [r for r in input_records(events, settings, five) if is_batch(r)]
    assert batched and set(asked) == {r.topic for r in batched}
    for record in batched:
        for content_type, raw in unpack(record.value):
            value = decode(raw, TOPIC_OF[record.topic], content_type=content_type)
            assert partition_of(record_key(value), 5) == record.partition
    assert {r.partition for r in batched} - {0, 1, 2}, "partitions 3 and 4 are used too"


def test_values_of_a_group_share_records_keyed_by_the_group_s_first_key() -> None:
    """The worker's utilization rows: one record per partition (the group), whatever the
    keys, keyed by its first value's key; values of another group never join it."""
    batches = Batches(max_items=3)
    rows = [("c/n1", b"1", 0), ("c/n2", b"2", 0), ("c/n3", b"3", 1), ("c/n1", b"4", 0),
            ("c/n4", b"5", 0)]  # fmt: skip
    for key, value, group in rows:
        batches.add("utilization", key, value, "application/json", group=group)
    taken = [(topic, key, [v for _, v in unpack(packed)]) for topic, key, packed in batches.take()]
    assert taken == [
        ("utilization", "c/n1", [b"1", b"2", b"4"]),
        ("utilization", "c/n1", [b"5"]),  # split at max_items: still the group's key
        ("utilization", "c/n3", [b"3"]),
    ]
