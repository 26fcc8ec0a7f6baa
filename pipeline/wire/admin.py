"""Create FleetPulse's topics on a real Kafka cluster (idempotent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import KafkaError

from pipeline.config import KafkaSettings
from pipeline.errors import FleetPulseError
from pipeline.wire.group_topics import TopicShape, group_name, group_topics
from pipeline.wire.kafka import check_login, client_kwargs
from pipeline.wire.topics import TOPICS, topic_configs, topic_name


@dataclass(frozen=True)
class TopicResult:
    name: str
    partitions: int
    created: bool
    note: str = ""


def create_topics(settings: KafkaSettings, bootstrap_timeout_s: float = 30.0,
                  group_id: str = "") -> list[TopicResult]:
    """Create every topic that is missing; report those that exist with their partition count.

    FleetPulse's topics, and the worker group's own (`group_id`, "" = the default group): its
    internal topics and its tables' changelogs, so that no worker of the group ever starts
    before them (pipeline/wire/group_topics.py says why).

    A topic that exists with a different partition count is reported, not altered: changing
    partitions moves keys between partitions, which breaks per-key state. Someone must decide.
    No broker answering within `bootstrap_timeout_s` is an error naming the bootstrap address.
    """
    check_login(settings)  # a refused TLS / SASL login: a clear error now, not a timeout
    try:
        admin = KafkaAdminClient(
            **client_kwargs(settings),
            client_id=f"{settings.client_id}-admin",
            request_timeout_ms=30_000,
            bootstrap_timeout_ms=int(bootstrap_timeout_s * 1000),
        )
    except KafkaError as exc:
        raise FleetPulseError(
            f"cannot reach Kafka at {settings.bootstrap} within {bootstrap_timeout_s:g} s "
            f"({type(exc).__name__}); is the broker running? The address is kafka.bootstrap "
            "in the config, or FLEETPULSE_KAFKA__BOOTSTRAP"
        ) from exc
    wanted = all_topics(settings, group_id)
    try:
        existing = _partition_counts(admin)
        missing = [topic for topic in wanted if topic.name not in existing]
        if missing:
            admin.create_topics(
                [
                    NewTopic(
                        name=topic.name,
                        num_partitions=topic.partitions,
                        replication_factor=settings.replication,
                        topic_configs=topic.configs,
                    )
                    for topic in missing
                ],
                validate_only=False,
            )
        created = {topic.name for topic in missing}
        return [_result(topic, existing, created) for topic in wanted]
    finally:
        admin.close()


def all_topics(settings: KafkaSettings, group_id: str = "") -> list[TopicShape]:
    """FleetPulse's topics, then the worker group's, as name, partitions and configs."""
    own = [
        TopicShape(topic_name(settings, spec.suffix), spec.partitions(settings),
                   topic_configs(settings, spec))
        for spec in TOPICS
    ]
    return own + list(group_topics(settings, group_name(settings, group_id)))


def _partition_counts(admin: KafkaAdminClient) -> dict[str, int]:
    described = admin.describe_topics()
    return {topic["name"]: len(topic["partitions"]) for topic in described}


def _result(topic: TopicShape, existing: dict[str, int], created: set[str]) -> TopicResult:
    if topic.name in created:
        return TopicResult(topic.name, topic.partitions, created=True)
    count, wanted = existing[topic.name], topic.partitions
    note = "" if count == wanted else f"has {count} partitions, wants {wanted}; left unchanged"
    return TopicResult(topic.name, count, created=False, note=note)


def require_topic(settings: KafkaSettings, suffix: str) -> str:
    """The topic's name, once the broker says it exists in the shape its spec wants (compacted
    where it must be). Checked before producing because a broker that creates topics on first
    use would make a plain, uncompacted one, and the mistake would only show much later."""
    spec = next(spec for spec in TOPICS if spec.suffix == suffix)
    name = topic_name(settings, suffix)
    check_login(settings)
    try:
        admin = KafkaAdminClient(
            **client_kwargs(settings),
            client_id=f"{settings.client_id}-admin",
            request_timeout_ms=30_000,
        )
    except KafkaError as exc:
        raise FleetPulseError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from exc
    try:
        if name not in _partition_counts(admin):
            raise FleetPulseError(
                f"topic {name} does not exist on {settings.bootstrap}: run `fleetpulse topics "
                "create` first"
            )
        resource = ConfigResource(ConfigResourceType.TOPIC, name)
        described = admin.describe_configs([resource])
        policy = _config_value(described, name, "cleanup.policy")
        wanted = topic_configs(settings, spec)["cleanup.policy"]
        if policy is not None and wanted not in policy.split(","):
            raise FleetPulseError(
                f"topic {name} has cleanup.policy={policy}, FleetPulse needs {wanted}: it was "
                "not created by `fleetpulse topics create`; fix it before writing to it"
            )
    finally:
        admin.close()
    return name


def _config_value(described: dict[str, Any], name: str, key: str) -> str | None:
    entry = described.get("topic", {}).get(name, {}).get(key)
    return None if entry is None else str(entry.get("value"))
