"""kafka.compression through the real broker: the simulator's real-shaped telemetry batches,
written by a FleetPulse producer with each codec, are stored compressed by the broker (its own
log sizes say so) and read back the same by both client libraries the consumers use
(kafka-python: adapters' edges, lake sink; aiokafka: the faust worker)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient, NewTopic

from pipeline.config import KafkaSettings, SimSettings
from pipeline.errors import ConfigError
from pipeline.sim.engine import Simulation
from pipeline.wire import kafka as wire_kafka
from pipeline.wire.batches import input_records

pytestmark = pytest.mark.kafka


def _records(kafka: KafkaSettings) -> list[bytes]:
    sim = Simulation(SimSettings(seed=3, duration_s=60, gpu_nodes=8, tpu_slices=1,
                                 random_faults=False))  # fmt: skip
    return [r.value for tick in sim.ticks() for r in input_records(tick, kafka, lambda _: 1)]


def _write(kafka: KafkaSettings, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**wire_kafka.producer_kwargs(kafka), acks="all", linger_ms=20,
                             batch_size=1 << 20, max_request_size=8 << 20)  # fmt: skip
    for value in values:
        producer.send(topic, value=value, partition=0)
    producer.flush(timeout=60)
    producer.close()


def _stored_bytes(admin: KafkaAdminClient, topic: str) -> int:
    (broker,) = admin.describe_log_dirs([topic])
    return sum(p["partition_size"] for d in broker["log_dirs"] for t in d["topics"]
               if t["name"] == topic for p in t["partitions"])  # fmt: skip


def _read_kafka_python(kafka: KafkaSettings, topic: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer(topic, **wire_kafka.client_kwargs(kafka),
                             auto_offset_reset="earliest", consumer_timeout_ms=20_000)  # fmt: skip
    values = []
    for record in consumer:
        values.append(record.value)
        if len(values) == count:
            break
    consumer.close()
    return values


def _read_aiokafka(kafka: KafkaSettings, topic: str, count: int) -> list[bytes]:
    async def read() -> list[bytes]:
        consumer = AIOKafkaConsumer(topic, **wire_kafka.client_kwargs(kafka, "aiokafka"),
                                    auto_offset_reset="earliest")  # fmt: skip
        await consumer.start()
        values: list[bytes] = []
        try:
            while len(values) < count:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 20)
                values += [r.value for records in batch.values() for r in records]
        finally:
            await consumer.stop()
        return values

    return asyncio.run(read())


def test_each_codec_is_stored_compressed_and_read_back_by_both_clients(
    kafka_settings: KafkaSettings,
) -> None:
    values = _records(kafka_settings)
    assert len(values) > 20
    admin = KafkaAdminClient(**wire_kafka.client_kwargs(kafka_settings))
    stored: dict[str, int] = {}
    try:
        for codec in ("none", "zstd", "lz4", "gzip"):
            kafka = msgspec.structs.replace(kafka_settings, compression=codec)
            if codec == "lz4" and wire_kafka.missing_codec_packages("lz4"):
                continue  # lz4 is not a dependency; zstd is the default
            topic = f"{kafka.topic_prefix}.compression.{codec}"
            admin.create_topics([NewTopic(topic, 1, 1)])
            _write(kafka, topic, values)
            assert _read_kafka_python(kafka, topic, len(values)) == values, codec
            assert _read_aiokafka(kafka, topic, len(values)) == values, codec
            stored[codec] = _stored_bytes(admin, topic)
    finally:
        admin.close()
    raw = sum(map(len, values))
    assert stored["none"] >= raw  # record overhead only
    # the default: telemetry batches shrink several times over (bench/bench_compression.py)
    assert stored["zstd"] < stored["none"] / 3, stored
    assert stored["gzip"] < stored["none"] / 3, stored


def test_the_default_is_zstd_and_a_missing_codec_package_is_named() -> None:
    assert KafkaSettings().compression == "zstd"
    assert wire_kafka.producer_kwargs(KafkaSettings())["compression_type"] == "zstd"
    faust = wire_kafka.producer_kwargs(KafkaSettings(compression="gzip"), "faust")
    assert faust["producer_compression_type"] == "gzip"
    assert wire_kafka.producer_kwargs(KafkaSettings(compression="none"))["compression_type"] is None
    if wire_kafka.missing_codec_packages("lz4"):
        with pytest.raises(ConfigError, match=r"kafka\.compression 'lz4' needs .*lz4"):
            wire_kafka.producer_kwargs(KafkaSettings(compression="lz4"))
