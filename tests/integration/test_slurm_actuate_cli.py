"""`fleetpulse actuate slurm` and `fleetpulse watch slurm` end to end: actions on a real Kafka,
a real slurmctld with a real job, outcomes echoed on fleet.events.node as node_event/2, a bad
value dead-lettered; the watcher sends the inventory and a person's drain."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kafka import KafkaConsumer, KafkaProducer

from pipeline.config import KafkaSettings
from pipeline.model import Action, DeadLetter, Inventory, NodeEvent
from pipeline.wire import codec
from pipeline.wire.admin import create_topics
from pipeline.wire.topics import topic_name
from tests.integration.test_slurm_actuator import action
from tests.slurm_fixture import CLUSTER, NODES, ZONE, SlurmLab, slurm, slurm_conf  # noqa: F401

pytestmark = pytest.mark.kafka


def _env(kafka: KafkaSettings, lab: SlurmLab) -> dict[str, str]:
    return {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
            "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
            "FLEETPULSE_KAFKA__PARTITIONS": "3", "FLEETPULSE_METRICS__PORT": "0",
            "FLEETPULSE_SLURM__CONF": lab.conf, "FLEETPULSE_SLURM__CLUSTER": CLUSTER,
            "FLEETPULSE_SLURM__ZONE": ZONE, "FLEETPULSE_SLURM__DRAIN_POLL_S": "0.3",
            "FLEETPULSE_SLURM__POLL_S": "0.5",
            "FLEETPULSE_SLURM__GROUP_ID": f"act-{kafka.topic_prefix}"}  # fmt: skip


def _fleetpulse(kafka: KafkaSettings, lab: SlurmLab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=_env(kafka, lab),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def _records(kafka: KafkaSettings, suffix: str) -> list[tuple[bytes, bytes | None]]:
    consumer = KafkaConsumer(topic_name(kafka, suffix), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=2000)  # fmt: skip
    try:
        return [(record.key, record.value) for record in consumer]
    finally:
        consumer.close()


def test_actions_are_carried_out_and_every_outcome_is_echoed(
    kafka_settings: KafkaSettings, slurm: SlurmLab  # noqa: F811
) -> None:
    create_topics(kafka_settings)  # (`fleetpulse topics create`'s own test is elsewhere)
    mine, theirs = slurm.node(), slurm.node()
    slurm.job(mine, 1)
    slurm.drain_by_person(theirs, "bad DIMM")
    actions = [action(mine, "cordon"), action(mine, "drain"), action(theirs, "uncordon"),
               action(mine, "reboot", dry_run=True)]  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all")
    topic = topic_name(kafka_settings, "actions")
    for act in actions:
        key = f"{CLUSTER}/{act.target.name}".encode()
        producer.send(topic, key=key, value=codec.encode(act)).get(timeout=30)
    current = Action.__struct_config__.tag
    producer.send(topic, key=b"x/y", value=b'{"schema": "%s", "kind": "zap"}'
                  % str(current).encode()).get(30)  # fmt: skip
    producer.close()

    run = _fleetpulse(kafka_settings, slurm, "actuate", "slurm", "--idle-exit", "2")
    assert run.returncode == 0, run.stderr
    echoes = [codec.decode(v, NodeEvent) for _, v in _records(kafka_settings, "events.node")
              if v is not None]  # fmt: skip
    assert [(e.kind, e.action_id) for e in echoes if e.target == mine] == [
        ("cordoned", actions[0].action_id), ("drained", actions[1].action_id)]
    assert [(e.kind, e.action_id) for e in echoes if e.target == theirs] == [
        ("held", actions[2].action_id)]
    assert slurm.state(mine).drain and not slurm.state(mine).busy
    assert slurm.state(theirs).reason == "bad DIMM"
    (letter,) = [codec.decode(v, DeadLetter) for _, v in _records(kafka_settings, "dlq")
                 if v is not None]  # fmt: skip
    assert "kind" in letter.error or "action_id" in letter.error
    # (the commit after the echoes is the shared edge's: test_kubernetes_actuate_cli.py runs
    # the actuator a second time in the same group and finds nothing left)
    assert "5 records, 4 actions" in run.stdout, run.stdout


def test_the_watcher_command_sends_inventory_and_a_persons_drain(
    kafka_settings: KafkaSettings, slurm: SlurmLab  # noqa: F811
) -> None:
    create_topics(kafka_settings)  # (`fleetpulse topics create`'s own test is elsewhere)
    node = slurm.node()
    watcher = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "watch", "slurm"],
                               env=_env(kafka_settings, slurm), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen: dict[str, list[tuple[bytes, bytes | None]]] = {"inventory": [], "events.node": []}
    consumer = KafkaConsumer(*(topic_name(kafka_settings, t) for t in seen),
                             bootstrap_servers=kafka_settings.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip

    def read(suffix: str, count: int) -> bool:
        """Whether `count` records are on the topic now (after reading what arrived)."""
        assert watcher.poll() is None, watcher.communicate()
        for part, records in consumer.poll(timeout_ms=300).items():
            topic = part.topic.removeprefix(f"{kafka_settings.topic_prefix}.")
            seen[topic] += [(r.key, r.value) for r in records]
        return len(seen[suffix]) >= count

    key = f"{CLUSTER}/{node}".encode()
    try:
        slurm.until(lambda: read("inventory", len(NODES)), 60, "every node in the inventory")
        slurm.drain_by_person(node, "fan failure")
        slurm.until(lambda: read("events.node", 1), 30, "the person's drain on fleet.events.node")
        (drained,) = [codec.decode(v, NodeEvent) for k, v in seen["events.node"]
                      if k == key and v is not None]  # fmt: skip
        assert drained.kind == "cordoned" and "fan failure" in drained.reason
        records = [codec.decode(v, Inventory) for k, v in seen["inventory"]
                   if k == key and v is not None]  # fmt: skip
        assert records[0].accelerator == "h100" and records[0].capacity == 8
    finally:
        watcher.terminate()
        out, err = watcher.communicate(timeout=60)
        consumer.close()
    assert watcher.returncode == 0, err
    assert "watcher:" in out and "failed" in out
