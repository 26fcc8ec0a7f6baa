"""The topics FleetPulse uses: name, value type, key, partitioning and retention.

Co-partitioned topics (everything keyed by node or slice that one worker must see together)
share `settings.kafka.partitions`; `fleet.node-state` is compacted (latest state per target).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import KafkaSettings
from pipeline.model import (
    Action,
    Alert,
    CapacityEvent,
    DeadLetter,
    Event,
    Finding,
    GpuSample,
    IciSample,
    NodeEvent,
    NodeState,
    Proposal,
    TpuSample,
    Utilization,
    XidEvent,
)


@dataclass(frozen=True)
class TopicSpec:
    suffix: str
    value: type[Event]
    key: str  # what the record key is, for people and for the partitioning test
    compacted: bool = False
    retention_factor: int = 1  # multiples of settings.kafka.retention_ms


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("telemetry.gpu", GpuSample, "node"),
    TopicSpec("telemetry.tpu", TpuSample, "slice"),
    TopicSpec("telemetry.ici", IciSample, "slice"),
    TopicSpec("events.xid", XidEvent, "node"),
    TopicSpec("events.node", NodeEvent, "target"),
    TopicSpec("events.capacity", CapacityEvent, "zone"),
    TopicSpec("findings", Finding, "target"),
    TopicSpec("proposals", Proposal, "pool"),
    TopicSpec("actions", Action, "target"),
    TopicSpec("node-state", NodeState, "target", compacted=True),
    TopicSpec("alerts", Alert, "fingerprint"),
    TopicSpec("utilization", Utilization, "target"),
    # Dead letters are kept four times longer: someone has to read them and fix a producer.
    TopicSpec("dlq", DeadLetter, "source key", retention_factor=4),
)


def topic_name(settings: KafkaSettings, suffix: str) -> str:
    return f"{settings.topic_prefix}.{suffix}"


def topic_configs(settings: KafkaSettings, spec: TopicSpec) -> dict[str, str]:
    if spec.compacted:
        return {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}
    return {
        "cleanup.policy": "delete",
        "retention.ms": str(settings.retention_ms * spec.retention_factor),
    }
