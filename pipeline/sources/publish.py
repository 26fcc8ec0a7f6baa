"""Where ingest batches go: Kafka (kafka-python, acks=all), or JSON lines on stdout.

Keys follow the partitioning rules of DESIGN §1: GPU samples and XID events by node, TPU chip
and ICI samples by slice, capacity events by zone. Rejected inputs go to fleet.dlq with the
source name in place of a topic (they never were on one) and partition/offset -1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import IO

from pipeline import deadletter
from pipeline.codec import encode
from pipeline.config import KafkaSettings
from pipeline.errors import SourceError
from pipeline.kafka_client import check_login, client_kwargs
from pipeline.model import (
    DeadLetter,
    Event,
)
from pipeline.runtime.topics import TOPICS, record_key, topic_name
from pipeline.sources.base import BadRecord

_SEND_TIMEOUT_S = 30.0


def dead_letter(source: str, bad: BadRecord, now_ms: int) -> DeadLetter:
    return deadletter.dead_letter(
        ts_ms=now_ms,
        topic=f"source.{source}",
        partition=-1,
        offset=-1,
        key=None,
        raw=bad.raw,
        error=str(bad.error),
        reason=bad.error.reason,
    )


class KafkaPublisher:
    """Sends every event to its topic and waits for the broker's acknowledgement."""

    def __init__(self, settings: KafkaSettings, client_id: str) -> None:
        from kafka import KafkaProducer  # the kafka client only where Kafka is used
        from kafka.errors import KafkaError

        self._error = KafkaError
        self._settings = settings
        self._topics = {spec.value: topic_name(settings, spec.suffix) for spec in TOPICS}
        check_login(settings)  # a refused login fails here, not after a bootstrap timeout
        try:
            self._producer = KafkaProducer(
                **client_kwargs(settings),
                client_id=client_id,
                acks="all",
                linger_ms=5,
            )
        except KafkaError as exc:
            raise SourceError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from exc
        # the producer bootstrapped (it reached the broker); a batch the broker did not
        # acknowledge makes the adapter not ready until one is acknowledged again
        self._ready = (True, f"connected to {settings.bootstrap}")

    def publish(self, source: str, events: Sequence[Event], bad: Sequence[BadRecord]) -> None:
        now_ms = int(time.time() * 1000)
        futures = [
            self._producer.send(
                self._topics[type(event)], key=record_key(event).encode(), value=encode(event)
            )
            for event in events
        ]
        dlq = topic_name(self._settings, "dlq")
        futures += [
            self._producer.send(dlq, value=encode(dead_letter(source, record, now_ms)))
            for record in bad
        ]
        try:
            for future in futures:
                future.get(timeout=_SEND_TIMEOUT_S)
        except self._error as exc:
            self._ready = (False, f"Kafka did not acknowledge the last batch: {exc}")
            raise SourceError(f"{source}: Kafka did not acknowledge the batch: {exc}") from exc
        self._ready = (True, f"connected to {self._settings.bootstrap}")

    def readiness(self) -> tuple[bool, str]:
        """/readyz: the broker answered, and acknowledged the last batch."""
        return self._ready

    def close(self) -> None:
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
