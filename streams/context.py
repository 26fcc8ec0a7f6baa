"""What the agents share: settings, topics, tables, metrics, the settler and the clocks.

Tables hold each key's state as bytes (`route.encode_state`, msgpack) with bytes keys, so what
is recovered from a changelog is byte-for-byte what was written. Writes go through `store`,
which sends the changelog record to the source record's partition itself and returns the
send's future: the Settler waits for it before the record is acked, and it works outside a
stream iteration too (the staleness timer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import faust
import msgspec

from pipeline.config import Settings
from pipeline.model import Action, Alert, Event, Finding
from pipeline.runtime import route
from pipeline.runtime.topics import TOPICS, topic_name
from streams.acks import Settler
from streams.clock import PartitionClocks
from streams.metrics import WorkerMetrics
from streams.records import Record, dead_letter

log = logging.getLogger("fleetpulse.worker")
S = TypeVar("S")
Futures = list[Awaitable[Any]]
_ENCODER = msgspec.json.Encoder()

# Internal topics (created by faust, named after the app like its changelogs): the policy's
# input keyed by pool (proposals, node states, capacity events fanned out by zone) and the
# zone stage's node states keyed by zone.
POLICY_INPUT = "policy-input"
ZONE_INPUT = "zone-input"


@dataclass
class Context:
    settings: Settings
    app: faust.App
    metrics: WorkerMetrics
    settler: Settler
    clocks: PartitionClocks = field(default_factory=PartitionClocks)
    topics: dict[str, Any] = field(default_factory=dict)  # faust Topics by suffix/internal
    tables: dict[str, Any] = field(default_factory=dict)  # faust Tables
    value_types: dict[str, type[Event]] = field(default_factory=dict)  # by full topic name
    next_offset: dict[tuple[str, int], int] = field(default_factory=dict)

    def name(self, suffix: str) -> str:
        name: str = self.topics[suffix].get_topic_name()
        return name

    # --- state ------------------------------------------------------------------------------

    def load(self, table: str, key: bytes, cls: type[S]) -> S | None:
        raw = self.tables[table].data.get(key)
        if raw is None:
            return None
        try:
            return route.decode_state(raw, cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # a state written by an older release: start this key afresh (re-warm) rather
            # than stop the stream; the counter says how often that happens
            log.warning("table %s key %r: undecodable state (%s); starting afresh", table, key, exc)
            self.metrics.state_resets.labels(table).inc()
            return None

    def store(self, table: str, partition: int, key: bytes, state: Any) -> Awaitable[Any]:
        raw = route.encode_state(state)
        t = self.tables[table]
        fut: Awaitable[Any] = t.send_changelog(partition, key, raw)
        t.data[key] = raw
        return fut

    # --- outputs ----------------------------------------------------------------------------

    def send(self, topic: str, key: str, event: Event) -> Awaitable[Any]:
        channel = self.topics[topic]
        self.metrics.records_out.labels(channel.get_topic_name()).inc()
        fut: Awaitable[Any] = channel.send_soon(key=key.encode(), value=_ENCODER.encode(event))
        return fut

    def send_finding(self, finding: Finding) -> Awaitable[Any]:
        self.metrics.findings.labels(finding.check, str(finding.healthy).lower()).inc()
        return self.send("findings", route.health_key(finding), finding)

    def send_action(self, action: Action) -> Awaitable[Any]:
        self.metrics.actions.labels(action.kind, str(action.dry_run).lower()).inc()
        return self.send("actions", action.target.name, action)

    def send_alert(self, alert: Alert) -> Awaitable[Any]:
        self.metrics.alerts.labels(alert.status).inc()
        return self.send("alerts", alert.fingerprint, alert)

    def send_dead_letter(self, record: Record, error: str, reason: str) -> Awaitable[Any]:
        self.metrics.dead_letters.labels(record.topic, reason).inc()
        log.warning(
            "dead letter from %s[%d]@%d: %s", record.topic, record.partition, record.offset, error
        )
        letter = dead_letter(record, error)
        key = "" if record.key is None else record.key.decode("utf-8", errors="replace")
        return self.send("dlq", key, letter)


def declare_topics(
    app: faust.App, settings: Settings
) -> tuple[dict[str, Any], dict[str, type[Event]]]:
    """faust topics for every FleetPulse topic (raw bytes) and the two internal ones."""
    topics: dict[str, Any] = {}
    value_types: dict[str, type[Event]] = {}
    for spec in TOPICS:
        name = topic_name(settings.kafka, spec.suffix)
        topics[spec.suffix] = app.topic(
            name, key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw"
        )
        value_types[name] = spec.value
    for internal in (POLICY_INPUT, ZONE_INPUT):
        topics[internal] = app.topic(
            f"{app.conf.id}-{internal}",
            key_type=bytes,
            value_type=bytes,
            value_serializer="raw",
            key_serializer="raw",
            partitions=settings.kafka.partitions,
            replicas=settings.kafka.replication,
            internal=True,
            retention=settings.kafka.retention_ms / 1000,
        )
    return topics, value_types
