"""Many values in one record: the worker's own fleet-input topic, and producers' telemetry.

The telemetry stage passes a value on to the fleet stage for much of what it reads (a peer
sample for each GPU sample of a node at work, a tick for each fabric sample), and every
record costs the worker a produce, a fetch and faust's per-event machinery at both ends. So
the Kafka driver queues these values per key (cluster) and writes them once
per settled batch (Context.flush), as one record whose `fleetpulse-batch` header says so: a
msgpack array of [content type, value] pairs, each value encoded as it would be on its own.
The fleet stage holds every signal until all live nodes of its cluster have reported up to its
time anyway, so waiting for the batch costs it nothing; records on the XID path are never held.
The capacity stage's input (one partition, one fleet-wide key, a value per utilization row)
is batched the same way; a member's tombstone on it is written after the values queued
before it (agents.send_all), so the stage sees them in the order they were produced.

The topic is internal (created and read by the worker alone); the embedded runtime calls the
fleet stage directly and has no such records.

Producers may batch the telemetry topics the same way (`PRODUCER_BATCHED`): a record then holds
samples of many nodes or slices, each value keyed by its own target, all of one partition
(`partition_of`: the one the producers' default partitioner gives the value's key, so its state
lives where a record of its own would have put it). The worker's per-record cost (a fetch,
faust's per-event machinery, an ack) is then paid once per batch (bench/throughput.py measures
both). `group_by_partition` builds such records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import msgspec

from pipeline.config import KafkaSettings
from pipeline.errors import DecodeError
from pipeline.model import Event
from pipeline.wire.codec import encode_as, header_of, record_headers
from pipeline.wire.internal import CAPACITY_INPUT, FLEET_INPUT, TELEMETRY_TOPICS
from pipeline.wire.topics import TOPICS, record_key, topic_name

BATCH_HEADER = "fleetpulse-batch"
# topic suffixes whose values the driver batches: the fleet stage's input, and the capacity
# stage's (a value per utilization row, node state and inventory record, all of one key)
BATCHED = frozenset({FLEET_INPUT, CAPACITY_INPUT})
# output topics the driver batches per partition when `kafka.utilization_batch` is set: a
# record per partition and flush instead of a record per device and window
OUTPUT_BATCHED = frozenset({"utilization"})
# input topic suffixes whose batches hold values of many keys, each keyed by its own target
PRODUCER_BATCHED = frozenset(TELEMETRY_TOPICS)
MAX_ITEMS = 500  # values per record at most ...
MAX_BYTES = 512 * 1024  # ... and bytes (half of kafka.max_value_bytes' default)

_PACKER = msgspec.msgpack.Encoder()
_ITEMS = msgspec.msgpack.Decoder(type=list[tuple[str, bytes]])


def is_batch(record: Any) -> bool:
    """Does this record carry a batch (its headers name one)?"""
    return header_of(getattr(record, "headers", None), BATCH_HEADER) is not None


def headers() -> list[tuple[str, bytes]]:
    return [(BATCH_HEADER, b"1")]


def unpack(raw: bytes | None) -> list[tuple[str, bytes]]:
    """The (content type, value) pairs of a batch record, or DecodeError saying what is wrong."""
    if raw is None:
        raise DecodeError(field="$", expected="a batch (msgpack array)", got="a null value")
    try:
        return _ITEMS.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(
            field="$", expected="a batch: a msgpack array of [content type, value] pairs",
            got=str(exc),
        ) from None  # fmt: skip


class Batches:
    """Values queued per (topic suffix, group) until the driver's next flush, in arrival order;
    a group's record is keyed by the key of its first value."""

    def __init__(self, max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._queued: dict[tuple[str, object], tuple[str, list[tuple[str, bytes]]]] = {}

    def add(
        self, topic: str, key: str, value: bytes, content_type: str, group: object = None
    ) -> None:
        """Queue a value; `group` (default: its key) picks the values that share records."""
        where = (topic, key if group is None else group)
        queued = self._queued.get(where)
        if queued is None:
            queued = self._queued[where] = (key, [])
        queued[1].append((content_type, value))

    def clear(self) -> None:
        self._queued.clear()

    def take(self) -> Iterator[tuple[str, str, bytes]]:
        """(topic suffix, key, packed value) for everything queued, emptying the queue: the
        values of a group in order, split where a record would pass max_items or max_bytes."""
        queued, self._queued = self._queued, {}
        for (topic, _), (key, items) in queued.items():
            for chunk in _chunks(items, self.max_items, self.max_bytes):
                yield topic, key, _PACKER.encode(chunk)


def _chunks(
    items: list[tuple[str, bytes]], max_items: int, max_bytes: int
) -> Iterator[list[tuple[str, bytes]]]:
    chunk: list[tuple[str, bytes]] = []
    size = 0
    for item in items:
        item_size = len(item[0]) + len(item[1]) + 8  # with msgpack's framing, about
        if chunk and (len(chunk) >= max_items or size + item_size > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += item_size
    if chunk:
        yield chunk


def partition_of(key: str, partitions: int) -> int:
    """The partition the producers' default partitioner puts `key` in: murmur2 of its bytes,
    as the Java client, kafka-python and aiokafka all compute it."""
    return (_murmur2(key) & 0x7FFFFFFF) % partitions


@functools.lru_cache(maxsize=1 << 16)
def _murmur2(key: str) -> int:
    # kafka-python's murmur2 is pure Python (microseconds a key), asked for every value of a
    # batch; the keys are the fleet's nodes and slices, a bounded set
    from kafka.partitioner.default import murmur2  # the kafka client only where Kafka is used

    hashed: int = murmur2(key.encode())
    return hashed


def group_by_partition(
    values: Iterable[tuple[str, str, bytes]], partitions: int,
    max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES,
) -> Iterator[tuple[int, str, bytes]]:
    """(key, content type, value) triples of one topic as batch records: (partition, the key of
    its first value, packed value), each partition's values in their order, split where a
    record would pass max_items or max_bytes."""
    queued: dict[int, list[tuple[str, bytes]]] = {}
    first: dict[int, str] = {}
    for key, content_type, value in values:
        partition = partition_of(key, partitions)
        first.setdefault(partition, key)
        queued.setdefault(partition, []).append((content_type, value))
    for partition, items in queued.items():
        for chunk in _chunks(items, max_items, max_bytes):
            yield partition, first[partition], _PACKER.encode(chunk)


class OutRecord(NamedTuple):
    """A record as a producer sends it; `partition` None: the key picks it."""

    topic: str
    key: str
    value: bytes
    headers: list[tuple[str, bytes]]
    partition: int | None = None


_SUFFIX: dict[type[Event], str] = {spec.value: spec.suffix for spec in TOPICS}


def input_records(
    events: Sequence[Event], settings: KafkaSettings,
    partitions: Callable[[str], int] | None = None,
) -> list[OutRecord]:
    """FleetPulse's producers' records for input events (one poll of an ingest adapter, one
    tick of the simulator): a record per event, keyed by its target and encoded in
    `telemetry_format`; with `telemetry_batch`, the telemetry events as batch records instead,
    one per topic and partition, each partition's values in the events' order.

    `partitions(topic)`: how many partitions the topic has (a producer asks the broker, so a
    topic made with another count still gets each value where its key's record would go);
    `settings.partitions`, as `fleetpulse topics create` makes them, when not given."""
    out: list[OutRecord] = []
    batched: dict[str, list[tuple[str, str, bytes]]] = {}
    for event in events:
        suffix = _SUFFIX[type(event)]
        value, content_type = encode_as(event, settings.telemetry_format)
        if settings.telemetry_batch and suffix in PRODUCER_BATCHED:
            batched.setdefault(suffix, []).append((record_key(event), content_type, value))
        else:
            out.append(OutRecord(topic_name(settings, suffix), record_key(event), value,
                                 record_headers(content_type)))  # fmt: skip
    for suffix, values in batched.items():
        topic = topic_name(settings, suffix)
        count = partitions(topic) if partitions is not None else settings.partitions
        out += [OutRecord(topic, key, packed, headers(), partition)
                for partition, key, packed in group_by_partition(values, count)]
    return out
