"""Where a simulation goes: JSONL files (events + ground truth) or the Kafka topics.

JSONL: one encoded event per line (pipeline.wire.codec.encode), the ground truth beside it as
`<stem>.truth.jsonl`, one InjectedFault per line. Kafka: each event to its topic from
pipeline.wire.topics, keyed as that topic's spec says (node, slice, zone or target).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from pipeline.config import KafkaSettings
from pipeline.errors import SinkError
from pipeline.model import (
    Event,
)
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import InjectedFault
from pipeline.wire import codec
from pipeline.wire.batches import input_records
from pipeline.wire.kafka import (
    STAY_CONNECTED,
    check_login,
    partition_count,
    producer_kwargs,
    until_connected,
)
from pipeline.wire.topics import TOPICS, topic_name

Progress = Callable[[int, int], None]  # (ticks done, ticks in all)
_TRUTH_ENCODER = msgspec.json.Encoder()


def truth_path(events_path: Path) -> Path:
    return events_path.with_name(events_path.name.removesuffix(".jsonl") + ".truth.jsonl")


def write_truth(faults: Iterable[InjectedFault], path: Path) -> None:
    with path.open("wb") as handle:
        for fault in faults:
            handle.write(_TRUTH_ENCODER.encode(fault) + b"\n")


def read_truth(path: Path) -> list[InjectedFault]:
    decoder = msgspec.json.Decoder(InjectedFault)
    with path.open("rb") as handle:
        return [decoder.decode(line) for line in handle if line.strip()]


def write_jsonl(sim: Simulation, path: Path | str, progress: Progress | None = None) -> int:
    """Write every event to `path` (one per line) and the ground truth beside it; returns the
    number of events. The file is written under a temporary name and renamed when complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_truth(sim.ground_truth, truth_path(path))
    partial = path.with_name(path.name + ".partial")
    count = 0
    with partial.open("wb", buffering=1 << 20) as handle:
        for i, tick in enumerate(sim.ticks()):
            if tick:
                handle.write(b"\n".join(codec.encode(e) for e in tick) + b"\n")
                count += len(tick)
            if progress is not None:
                progress(i + 1, sim.n_ticks)
    partial.replace(path)
    return count


def topic_for(settings: KafkaSettings, event: Event) -> str:
    for spec in TOPICS:
        if type(event) is spec.value:
            return topic_name(settings, spec.suffix)
    raise TypeError(f"no topic carries {type(event).__name__}")


BROKER_AWAY_MS = 300_000  # how long a send waits for a broker that went away (5 min)


def produce_kafka(
    sim: Simulation,
    settings: KafkaSettings,
    progress: Progress | None = None,
    linger_ms: int = 20,
) -> int:
    """Send every event to its topic (acks=all, batched); returns the number sent. Raises
    SinkError if the broker does not acknowledge them all."""
    from kafka import KafkaProducer  # the Kafka client only when asked to produce

    check_login(settings)  # a refused login fails here, clearly, not after a bootstrap timeout
    # a broker away at start is waited for; one that goes away meanwhile holds the sends (up to
    # BROKER_AWAY_MS) instead of failing them
    producer = until_connected(
        lambda: KafkaProducer(
            **producer_kwargs(settings),
            **STAY_CONNECTED,
            client_id=f"{settings.client_id}-simulate",
            acks="all",
            linger_ms=linger_ms,
            batch_size=512 * 1024,
            max_request_size=8 * 1024 * 1024,
            key_serializer=str.encode,
            max_block_ms=BROKER_AWAY_MS,
            delivery_timeout_ms=BROKER_AWAY_MS,
        ),
        settings, "simulate",
    )
    assert producer is not None  # without a stop event it returns only once connected
    sent = 0
    failures: list[BaseException] = []
    partitions = partition_count(producer)
    try:
        for i, tick in enumerate(sim.ticks()):
            for record in input_records(tick, settings, partitions):
                future = producer.send(record.topic, key=record.key, value=record.value,
                                       headers=record.headers, partition=record.partition)
                future.add_errback(failures.append)
            sent += len(tick)
            if failures:
                break
            if progress is not None:
                progress(i + 1, sim.n_ticks)
        producer.flush()
    finally:
        producer.close()
    if failures:
        raise SinkError(
            f"Kafka did not acknowledge {len(failures)} simulated events: {failures[0]}"
        )
    return sent
