"""The worker group's own topics: the internal topics between stages and the changelogs of
the stages' state tables, named after the group (the faust app id, streams/app.py).

They are created ahead of faust, by `fleetpulse topics create` and by every worker before its
app starts (streams/worker.py), never by faust itself: faust declares a table's changelog a
second after its consumer has joined the group, so a group leader whose metadata did not have
it yet assigned without it (aiokafka: "Topic …-policy-changelog not found in cluster
metadata"; faust: "Ignoring missing topic") and a worker joining a running group stalled
before its first record. A topic that exists before any client of the group starts is in
every member's first metadata.

faust's names and shapes, which these must equal (faust `Table._new_changelog_topic`):
`<app id>-<table>-changelog`, the table's partition count, `cleanup.policy=compact` and no
retention; tests/integration/test_streams_parts.py checks them against the app's tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config import KafkaSettings
from pipeline.wire.internal import INTERNAL, ONE_PARTITION
from pipeline.wire.internal import TABLES as TABLES


@dataclass(frozen=True)
class TopicShape:
    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # {} = the broker's defaults


def group_name(kafka: KafkaSettings, group_id: str = "") -> str:
    """The worker's consumer group and faust app id (`worker.group_id`, "" = the default)."""
    return group_id or f"{kafka.topic_prefix}-worker"


def internal_partitions(kafka: KafkaSettings, name: str) -> int:
    return 1 if name in ONE_PARTITION else kafka.partitions


def table_partitions(kafka: KafkaSettings, table: str) -> int:
    return 1 if table in ONE_PARTITION else kafka.partitions


def changelog_name(group: str, table: str) -> str:
    return f"{group}-{table}-changelog"


def group_topics(kafka: KafkaSettings, group: str) -> tuple[TopicShape, ...]:
    """Every topic the worker group `group` reads or writes besides FleetPulse's own."""
    # internal topics keep the broker's default configs, as the worker has always made them
    internal = tuple(
        TopicShape(f"{group}-{name}", internal_partitions(kafka, name)) for name in INTERNAL
    )
    changelogs = tuple(
        TopicShape(
            changelog_name(group, table),
            table_partitions(kafka, table),
            # compacted: the newest state per key is all a worker replays when it takes over
            {"cleanup.policy": "compact"},
        )
        for table in TABLES
    )
    return internal + changelogs
