"""Create FleetPulse's topics on a real Kafka cluster (idempotent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import KafkaError

from pipeline.config import KafkaSettings
from pipeline.errors import FleetPulseError
from pipeline.kafka_client import check_login, client_kwargs
from pipeline.runtime.topics import TOPICS, TopicSpec, topic_configs, topic_name


@dataclass(frozen=True)
class TopicResult:
    name: str
    partitions: int
    created: bool
    note: str = ""


def create_topics(settings: KafkaSettings, bootstrap_timeout_s: float = 30.0
                  ) -> list[TopicResult]:
    """Create every topic that is missing; report those that exist with their partition count.

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
    try:
        existing = _partition_counts(admin)
        missing = [spec for spec in TOPICS if topic_name(settings, spec.suffix) not in existing]
        if missing:
            admin.create_topics(
                [
                    NewTopic(
                        name=topic_name(settings, spec.suffix),
                        num_partitions=spec.partitions(settings),
                        replication_factor=settings.replication,
                        topic_configs=topic_configs(settings, spec),
                    )
                    for spec in missing
                ],
                validate_only=False,
            )
        created = {topic_name(settings, spec.suffix) for spec in missing}
        return [
            _result(settings, spec, existing, created)
            for spec in TOPICS
        ]
    finally:
        admin.close()


def _partition_counts(admin: KafkaAdminClient) -> dict[str, int]:
    described = admin.describe_topics()
    return {topic["name"]: len(topic["partitions"]) for topic in described}


def _result(
    settings: KafkaSettings, spec: TopicSpec, existing: dict[str, int], created: set[str]
) -> TopicResult:
    name, wanted = topic_name(settings, spec.suffix), spec.partitions(settings)
    if name in created:
        return TopicResult(name, wanted, created=True)
    count = existing[name]
    note = "" if count == wanted else f"has {count} partitions, wants {wanted}; left unchanged"
    return TopicResult(name, count, created=False, note=note)


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
