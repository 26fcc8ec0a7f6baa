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
    CapacityAdvice,
    CapacityEvent,
    CapacitySnapshot,
    DeadLetter,
    Event,
    FabricSample,
    Finding,
    GpuSample,
    IciSample,
    Inventory,
    NodeEvent,
    NodeState,
    PolicyRelease,
    Proposal,
    TpuSample,
    Utilization,
    WithheldRecord,
    XidEvent,
)


@dataclass(frozen=True)
class TopicSpec:
    suffix: str
    value: type[Event]
    key: str  # what the record key is, for people and for the partitioning test
    compacted: bool = False
    retention_factor: int = 1  # multiples of settings.kafka.retention_ms
    single: bool = False  # one partition: read in one order by the fleet-wide policy stage

    def partitions(self, settings: KafkaSettings) -> int:
        return 1 if self.single else settings.partitions


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("telemetry.gpu", GpuSample, "cluster/node"),
    TopicSpec("telemetry.tpu", TpuSample, "cluster/slice"),
    TopicSpec("telemetry.ici", IciSample, "cluster/slice"),
    # node_exporter's network ports of GPU nodes, co-partitioned with telemetry.gpu.
    TopicSpec("telemetry.fabric", FabricSample, "cluster/node"),
    TopicSpec("events.xid", XidEvent, "cluster/node"),
    TopicSpec("events.node", NodeEvent, "cluster/target"),
    TopicSpec("events.capacity", CapacityEvent, "zone"),
    # Membership: who is in which cluster/pool/zone; the latest record per cluster/name.
    TopicSpec("inventory", Inventory, "cluster/name", compacted=True),
    # People releasing a common-cause pause (pipeline/decide/guard.py); read by the policy stage.
    TopicSpec("events.policy", PolicyRelease, "scope", single=True),
    TopicSpec("findings", Finding, "cluster/target"),
    TopicSpec("proposals", Proposal, "cluster/pool"),
    TopicSpec("actions", Action, "cluster/target"),
    TopicSpec("node-state", NodeState, "cluster/target", compacted=True),
    TopicSpec("alerts", Alert, "fingerprint"),
    # Why a proposal was held back or dropped (budget, caps, common cause, a person's hold...).
    TopicSpec("withheld", WithheldRecord, "cluster/target"),
    TopicSpec("utilization", Utilization, "cluster/target"),
    # Capacity per region/zone/type/provisioning model, the latest per key (issue 37), and
    # where to place a type and count, for schedulers.
    TopicSpec("capacity", CapacitySnapshot, "region/zone/type/model", compacted=True),
    TopicSpec("capacity.advice", CapacityAdvice, "type/count"),
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


def scoped(cluster: str, name: str) -> str:
    """A node or slice key: names repeat across clusters, targets must not (`cluster/name`)."""
    return f"{cluster}/{name}"


def record_key(event: Event) -> str:
    """The Kafka key of an input event, per the topic specs (DESIGN §1 keys and partitions):
    cluster/node, cluster/slice, zone, or the cluster/target a node event names."""
    if isinstance(event, GpuSample | XidEvent | FabricSample):
        return scoped(event.cluster, event.node)
    if isinstance(event, TpuSample | IciSample):
        return scoped(event.cluster, event.slice)
    if isinstance(event, CapacityEvent):
        return event.zone
    if isinstance(event, NodeEvent):
        return scoped(event.cluster, event.target)
    if isinstance(event, Inventory):
        return scoped(event.cluster, event.name)
    if isinstance(event, PolicyRelease):
        return f"{event.scope}:{event.name}"
    raise TypeError(f"no input key rule for {type(event).__name__}")


def capacity_key(snapshot: CapacitySnapshot) -> str:
    """fleet.capacity's key: one compacted record per region/zone/type/provisioning model."""
    parts = (snapshot.region, snapshot.zone, snapshot.accelerator_type)
    return "/".join((*parts, snapshot.provisioning_model))


def advice_key(advice: CapacityAdvice) -> str:
    """fleet.capacity.advice's key: the latest advice per type and count."""
    return f"{advice.accelerator_type}/{advice.count}"
