"""The Kafka side of the actuator and the watcher.

`ActuatorSink` is an edge sink (pipeline/edge.py): `add(record)` decodes one consumed record
(DecodeError for a bad value: dead-lettered), `flush()` carries the batch out and makes its
echoes durable (acknowledged by the broker), raising SinkError to prevent the commit.
`run_actuator` drives it with the shared runner, as the lake sink and alerts are driven.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.codec import decode, encode
from pipeline.config import Settings
from pipeline.edge import EdgeOptions, EdgeStats, run_edge
from pipeline.errors import SinkError
from pipeline.kafka_client import STAY_CONNECTED, check_login, client_kwargs
from pipeline.kube.actuator import Actuator
from pipeline.kube.watcher import Out
from pipeline.model import Action, NodeEvent
from pipeline.runtime.topics import record_key, topic_name
from pipeline.selfmetrics import Readiness

log = logging.getLogger(__name__)
_SEND_TIMEOUT_S = 30


class Producer:
    """acks=all sends, waited for: a batch returns only once the broker has it."""

    def __init__(self, settings: Settings, client_id: str) -> None:
        from kafka import KafkaProducer

        check_login(settings.kafka)
        self.settings = settings
        self._producer = KafkaProducer(**client_kwargs(settings.kafka), **STAY_CONNECTED,
                                       client_id=client_id,
                                       acks="all", linger_ms=5)  # fmt: skip

    def send(self, outs: Sequence[Out]) -> None:
        from kafka.errors import KafkaError

        futures = [
            self._producer.send(topic_name(self.settings.kafka, out.topic),
                                key=out.key.encode(), value=out.value)
            for out in outs
        ]
        try:
            for future in futures:
                future.get(timeout=_SEND_TIMEOUT_S)
        except KafkaError as exc:
            raise SinkError(f"Kafka did not acknowledge {len(outs)} records: {exc}") from exc

    def close(self) -> None:
        self._producer.close(timeout=_SEND_TIMEOUT_S)


class ActuatorSink:
    """fleet.actions records → the actuator, in the edge-sink shape (pipeline/edge.py).

    `add` only decodes and queues (DecodeError for a bad value); `flush` carries the queued
    actions out in order, then sends their echoes and waits for the broker. When the API
    server or Kafka fails, flush raises SinkError and keeps what is left: a retried flush goes
    on from there, and echoes already made are sent with it (actions done before a crash are
    recognised on the node by their ids). `discard` drops everything (the records come again).
    """

    def __init__(self, actuator: Actuator, send: Callable[[Sequence[Out]], None],
                 max_bytes: int) -> None:  # fmt: skip
        self.actuator, self.send, self.max_bytes = actuator, send, max_bytes
        self.queued: list[Action] = []
        self.pending: list[NodeEvent] = []

    def add(self, record: Any) -> None:
        self.queued.append(decode(record.value, Action, self.max_bytes))

    def flush(self) -> None:
        while self.queued:
            echo = self.actuator.handle(self.queued[0])  # SinkError: the rest waits
            self.queued.pop(0)
            if echo is not None:
                self.pending.append(echo)
        outs = [Out("events.node", record_key(e), encode(e)) for e in self.pending]
        if outs:
            self.send(outs)  # SinkError when not acknowledged: nothing is committed
        self.pending = []

    def discard(self) -> None:
        self.queued, self.pending = [], []


def run_actuator(
    settings: Settings,
    group_id: str,
    sink: ActuatorSink,
    *,
    stop: threading.Event,
    idle_exit_s: float | None = None,
    readiness: Readiness | None = None,
    stats: EdgeStats | None = None,
) -> EdgeStats:
    """fleet.actions through the edge runner (pipeline/edge.py) into the actuator: small
    batches in partition order (per-key order), a commit after each flushed batch; a flush the
    API server or Kafka fails is retried (done actions are recognised on the node by their
    ids); bad values go to fleet.dlq."""
    options = EdgeOptions(
        max_records=50, max_interval_s=0.0, idle_exit_s=idle_exit_s,
        max_poll_interval_s=max(300.0, 2 * settings.kubernetes.drain_timeout_s),
    )

    def started(edge: Any) -> None:
        if readiness is not None:
            readiness.check = edge.readiness

    return run_edge(settings, name="actuator", topics=[topic_name(settings.kafka, "actions")],
                    group_id=group_id, sink=sink, stop=stop, options=options, stats=stats,
                    on_start=started)
