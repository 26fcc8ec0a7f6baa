"""Where ingest batches go: Kafka (kafka-python, acks=all), or JSON lines on stdout.

Keys follow the partitioning rules of DESIGN §1: GPU samples and XID events by node, TPU chip
and ICI samples by slice, capacity events by zone. Rejected inputs go to fleet.dlq with the
source name in place of a topic (they never were on one) and partition/offset -1. Telemetry
values are written in `kafka.telemetry_format` (msgpack by default, with its content-type
header; pipeline/wire/codec.py), everything else as JSON; a poll's telemetry goes as one batch
record per topic and partition (pipeline/wire/batches.py) unless `kafka.telemetry_batch` is
false.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from pipeline.config import KafkaSettings
from pipeline.errors import BrokerUnavailableError
from pipeline.model import (
    DeadLetter,
    Event,
    RawRecord,
)
from pipeline.sources.base import BadRecord
from pipeline.wire.batches import input_records
from pipeline.wire.codec import encode
from pipeline.wire.kafka import STAY_CONNECTED, check_login, partition_count, producer_kwargs
from pipeline.wire.topics import topic_name

_SEND_TIMEOUT_S = 30.0


def dead_letter(source: str, bad: BadRecord, now_ms: int) -> DeadLetter:
    """A rejected input never reached a topic: the source's name stands in for one."""
    record = RawRecord(topic=f"source.{source}", value=bad.raw)
    return DeadLetter.from_record(
        record, reason=bad.error.reason, error=str(bad.error), ts_ms=now_ms
    )


class KafkaPublisher:
    """Sends every event to its topic and waits for the broker's acknowledgement."""

    def __init__(self, settings: KafkaSettings, client_id: str) -> None:
        from kafka.errors import KafkaError

        self._error = KafkaError
        self._settings = settings
        self._client_id = client_id
        check_login(settings)  # a refused login fails here, not after a bootstrap timeout
        self._producer: Any = None
        self._ready = (False, f"not connected to {settings.bootstrap} yet")
        # a broker away at start is not an exit: the first publish that reaches it connects,
        # and until then each poll fails and is retried by the ingest loop's backoff
        with contextlib.suppress(BrokerUnavailableError):
            self._connect()

    def _connect(self) -> Any:
        from kafka import KafkaProducer  # the kafka client only where Kafka is used

        if self._producer is None:
            try:
                self._producer = KafkaProducer(
                    **producer_kwargs(self._settings),
                    **STAY_CONNECTED,
                    client_id=self._client_id,
                    acks="all",
                    linger_ms=5,
                )
            except self._error as exc:
                reason = f"cannot reach Kafka at {self._settings.bootstrap}: {exc}"
                self._ready = (False, reason)
                raise BrokerUnavailableError(reason) from exc
            # the producer bootstrapped (it reached the broker); a batch the broker did not
            # acknowledge makes the adapter not ready until one is acknowledged again
            self._ready = (True, f"connected to {self._settings.bootstrap}")
        return self._producer

    def publish(self, source: str, events: Sequence[Event], bad: Sequence[BadRecord]) -> None:
        producer = self._connect()
        now_ms = int(time.time() * 1000)
        futures = [
            producer.send(r.topic, key=r.key.encode(), value=r.value, headers=r.headers,
                          partition=r.partition)
            for r in input_records(events, self._settings, partition_count(producer))
        ]  # fmt: skip
        dlq = topic_name(self._settings, "dlq")
        futures += [
            producer.send(dlq, value=encode(dead_letter(source, record, now_ms)))
            for record in bad
        ]
        try:
            for future in futures:
                future.get(timeout=_SEND_TIMEOUT_S)
        except self._error as exc:
            self._ready = (False, f"Kafka did not acknowledge the last batch: {exc}")
            msg = f"{source}: Kafka did not acknowledge the batch: {exc}"
            raise BrokerUnavailableError(msg) from exc
        self._ready = (True, f"connected to {self._settings.bootstrap}")

    def readiness(self) -> tuple[bool, str]:
        """/readyz: the broker answered, and acknowledged the last batch."""
        return self._ready

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=_SEND_TIMEOUT_S)


class StdoutPublisher:
    """JSON lines, one per event; dead letters too (for `fleetpulse ingest --stdout`)."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out or sys.stdout

    def publish(self, source: str, events: Sequence[Event], bad: Sequence[BadRecord]) -> None:
        now_ms = int(time.time() * 1000)
        for event in events:
            self._out.write(encode(event).decode() + "\n")
        for record in bad:
            self._out.write(encode(dead_letter(source, record, now_ms)).decode() + "\n")
        self._out.flush()

    def close(self) -> None:
        self._out.flush()
