"""Every component as its own principal: each forbidden write refused, each allowed one kept.

Issue 33: the chart gave every pod, the XID DaemonSet (root on every GPU node) included, one
SASL account that could write every topic, and the actuator obeyed whatever arrived on
fleet.actions. Now each component has its principal (pipeline/wire/acl.py, applied by kafka.sh's
secure profile and the Helm chart). On kafka.sh's secure broker (one for the module), every
principal writes one record to every FleetPulse topic and to the worker group's own topics; the
broker must refuse each write the issue forbids (TopicAuthorizationFailed) and keep each allowed
one, and what lands on each topic, read back as admin, must be exactly its writers' records.

WRITERS says who may write what in the issue's words, independent of the role table: only the
worker writes actions and the stage topics, only the watcher and the actuator node events,
only operators policy releases, the XID reader XID events and nothing else (but its dead
letters), each telemetry adapter only its telemetry. The broker is measured against it, and the
table too (a table that drifted from the rule fails here before it reaches a cluster). Each
consumer role also reads what it consumes, in its group, and is refused a topic it does not.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from kafka.structs import OffsetAndMetadata

from pipeline.config import KafkaSettings
from pipeline.wire.acl import ROLES, Role, may_write
from pipeline.wire.group_topics import changelog_name, group_name
from pipeline.wire.internal import CAPACITY_INPUT, POLICY_INPUT
from pipeline.wire.kafka import client_kwargs
from pipeline.wire.topics import TOPICS, topic_name
from tests.faults import reliability
from tests.integration.test_kafka_security import SecureBroker, running_secure_broker

pytestmark = pytest.mark.kafka
PREFIX = "fleet"
# Who may write each topic (suffix; "worker-" for the worker group's own topics), by role.
_TELEMETRY_ADAPTERS = {"ingest-prometheus", "ingest-cloudmon", "ingest-tpu-runtime"}
_DEAD_LETTERING = {"worker", "lake", "alerts", "actuator", "slurm-actuator", "ingest-xid",
                   "ingest-capacity", *_TELEMETRY_ADAPTERS}  # fmt: skip
WRITERS: dict[str, set[str]] = {
    "telemetry.gpu": {"ingest-prometheus"},
    "telemetry.fabric": {"ingest-prometheus"},  # node_exporter's ports, from Prometheus
    "telemetry.tpu": {"ingest-cloudmon", "ingest-tpu-runtime"},
    "telemetry.ici": {"ingest-tpu-runtime"},
    "events.xid": {"ingest-xid"},
    "events.node": {"watcher", "actuator", "slurm-watcher", "slurm-actuator"},
    # cloudmon's interruption counts are capacity events (pipeline/sources/cloudmon.py)
    "events.capacity": {"ingest-capacity", "ingest-cloudmon"},
    "inventory": {"inventory", "watcher", "slurm-watcher", "ingest-capacity"},
    "events.policy": {"operator"},
    "findings": {"worker"},
    "proposals": {"worker"},
    "actions": {"worker"},
    "node-state": {"worker", "watcher", "slurm-watcher"},  # watchers: a deleted node's tombstone
    "alerts": {"worker"},
    "withheld": {"worker"},  # why removals were held back: data, nobody acts on it
    "utilization": {"worker"},
    "capacity": {"worker"},  # the capacity snapshot (issue 37)
    "capacity.advice": {"worker"},
    "dlq": _DEAD_LETTERING,
    f"worker-{POLICY_INPUT}": {"worker"},
    "worker-policy-changelog": {"worker"},
    f"worker-{CAPACITY_INPUT}": {"worker"},  # the capacity stage's input, one partition
    "worker-capacity-changelog": {"worker"},
}
# What each consumer reads in its group, and one topic it must not read.
READS = {
    "worker": ("fleet-worker", "events.policy", "proposals"),
    "lake": ("fleetpulse-lake", "actions", "events.policy"),
    "alerts": ("fleetpulse-alerts", "alerts", "actions"),
    "actuator": ("fleetpulse-actuator-gke-1", "actions", "findings"),
}


def _topic(kafka: KafkaSettings, column: str) -> str:
    if column in (f"worker-{POLICY_INPUT}", f"worker-{CAPACITY_INPUT}"):
        return f"{group_name(kafka)}-{column.removeprefix('worker-')}"
    if column in ("worker-policy-changelog", "worker-capacity-changelog"):
        return changelog_name(group_name(kafka), column.split("-")[1])
    return topic_name(kafka, column)


@pytest.fixture(scope="module")
def broker() -> Iterator[SecureBroker]:
    with running_secure_broker((PREFIX,)) as running:
        topics = running.settings("fleetpulse-topics", topic_prefix=PREFIX)
        env = {
            "PATH": "/usr/bin:/bin",
            "FLEETPULSE_KAFKA__BOOTSTRAP": topics.bootstrap,
            "FLEETPULSE_KAFKA__PARTITIONS": str(topics.partitions),
            "FLEETPULSE_KAFKA__TOPIC_PREFIX": PREFIX,
            "FLEETPULSE_KAFKA__SECURITY_PROTOCOL": topics.security_protocol,
            "FLEETPULSE_KAFKA__SASL_MECHANISM": topics.sasl_mechanism,
            "FLEETPULSE_KAFKA__SASL_USERNAME": topics.sasl_username,
            "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE": topics.sasl_password_file,
            "FLEETPULSE_KAFKA__SSL_CAFILE": topics.ssl_cafile,
        }
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "topics", "create"],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        yield running


def test_the_rule_covers_every_topic_and_the_role_table_follows_it() -> None:
    kafka = KafkaSettings(topic_prefix=PREFIX)
    assert {spec.suffix for spec in TOPICS} <= set(WRITERS), "a topic nobody judged"
    table = {column: {r.name for r in ROLES if may_write(r, kafka, _topic(kafka, column))}
             for column in WRITERS}  # fmt: skip
    assert table == WRITERS


def _try_write(producer: KafkaProducer, topic: str, value: bytes) -> bool:
    """True when the broker acknowledged the record; False when it refused the principal."""
    try:
        producer.send(topic, key=b"probe", value=value).get(timeout=30)
    except TopicAuthorizationFailedError:
        return False
    return True


def _landed(admin: KafkaSettings, topic: str) -> set[str]:
    """The roles whose probe is on `topic` (read from the start as admin)."""
    consumer = KafkaConsumer(**client_kwargs(admin), group_id=None)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        found: set[str] = set()
        deadline = time.monotonic() + 30
        while any(consumer.position(p) < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"{topic}: not read to its end {ends}"
            for records in consumer.poll(timeout_ms=500).values():
                found |= {r.value.decode() for r in records}
        return found
    finally:
        consumer.close()


def _probe(broker: SecureBroker, role: Role) -> dict[str, bool]:
    """One record from `role` to every topic: which writes the broker acknowledged."""
    kafka = broker.settings(role.principal, topic_prefix=PREFIX)
    # not idempotent: kafka-python's idempotent producer takes a refused produce for a fatal
    # error and fails every later send, so one refusal would hide the rest
    producer = KafkaProducer(**client_kwargs(kafka), acks="all", max_block_ms=30_000,
                             enable_idempotence=False)  # fmt: skip
    try:
        return {column: _try_write(producer, _topic(kafka, column), role.name.encode())
                for column in WRITERS}  # fmt: skip
    finally:
        producer.close()


def test_every_role_writes_only_what_it_may(broker: SecureBroker) -> None:
    # the roles in parallel: each refusal costs a metadata round trip (~0.1 s), 234 of them
    with ThreadPoolExecutor(max_workers=len(ROLES)) as pool:
        results = dict(zip(ROLES, pool.map(lambda r: _probe(broker, r), ROLES), strict=True))
    accepted = {column: {r.name for r, done in results.items() if done[column]}
                for column in WRITERS}  # fmt: skip
    tried = [(r.name in WRITERS[c], ok) for r, done in results.items() for c, ok in done.items()]
    forbidden = sum(1 for may, _ in tried if not may)
    refused = sum(1 for may, ok in tried if not may and not ok)
    allowed = sum(1 for may, ok in tried if may and ok)
    reliability.record("control", "every component as its own principal: forbidden writes", {
        "forbidden writes tried": forbidden, "refused": refused,
        "allowed writes accepted": allowed,
    })  # fmt: skip
    assert accepted == WRITERS, "accepted writes (actual) != the rule (expected)"
    assert (refused, allowed) == (forbidden, len(tried) - forbidden)
    # nothing refused landed, everything accepted did: each topic holds its writers' probes
    admin = broker.settings(topic_prefix=PREFIX)
    landed = {column: _landed(admin, _topic(admin, column)) for column in WRITERS}
    assert landed == WRITERS


def _read(kafka: KafkaSettings, group: str, topic: str) -> None:
    """Read `topic` from the start and commit the position in `group` (both must be allowed)."""
    consumer = KafkaConsumer(**client_kwargs(kafka), group_id=group, enable_auto_commit=False)
    try:
        part = TopicPartition(topic, 0)
        consumer.assign([part])
        consumer.seek_to_beginning(part)
        consumer.poll(timeout_ms=500)
        consumer.commit({part: OffsetAndMetadata(consumer.position(part), "", -1)})
    finally:
        consumer.close()


@pytest.mark.parametrize("role", sorted(READS))
def test_every_consumer_reads_only_what_it_consumes(broker: SecureBroker, role: str) -> None:
    group, allowed, forbidden = READS[role]
    principal = next(r for r in ROLES if r.name == role).principal
    kafka = broker.settings(principal, topic_prefix=PREFIX)
    _read(kafka, group, topic_name(kafka, allowed))
    with pytest.raises(TopicAuthorizationFailedError):
        _read(kafka, group, topic_name(kafka, forbidden))
    with pytest.raises(GroupAuthorizationFailedError):
        _read(kafka, "someone-elses-group", topic_name(kafka, allowed))
