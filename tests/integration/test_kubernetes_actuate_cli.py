"""`fleetpulse actuate kubernetes` end to end: actions on a real Kafka, a real kube-apiserver,
outcomes echoed on fleet.events.node as node_event/2 the worker decodes, bad values
dead-lettered, and a second run (the same group) finds nothing left to do."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer

from pipeline.config import HealthSettings, KafkaSettings
from pipeline.decide.health import transition
from pipeline.model import Action, DeadLetter, NodeEvent
from pipeline.wire import codec
from pipeline.wire.topics import topic_name
from tests.integration.test_kubernetes_actuator import CLUSTER, action
from tests.kube_fixture import Kube

pytestmark = pytest.mark.kafka


def _fleetpulse(kafka: KafkaSettings, kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
           "FLEETPULSE_KAFKA__PARTITIONS": "3", "FLEETPULSE_METRICS__PORT": "0",
           "FLEETPULSE_KUBERNETES__KUBECONFIG": kube.kubeconfig,
           "FLEETPULSE_KUBERNETES__CLUSTER": CLUSTER,
           "FLEETPULSE_KUBERNETES__GROUP_ID": f"act-{kafka.topic_prefix}"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)  # fmt: skip


def _read(kafka: KafkaSettings, suffix: str) -> list[bytes]:
    consumer = KafkaConsumer(topic_name(kafka, suffix), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=3000)  # fmt: skip
    try:
        return [record.value for record in consumer]
    finally:
        consumer.close()


def test_actions_are_carried_out_and_every_outcome_is_echoed(
    kafka_settings: KafkaSettings, kube: Kube
) -> None:
    created = _fleetpulse(kafka_settings, kube, "topics", "create")
    assert created.returncode == 0, created.stderr
    mine, held = kube.node(), kube.node(unschedulable=True)
    kube.pod(mine)
    actions = [action(mine, "cordon"), action(mine, "drain"), action(held, "uncordon"),
               action(mine, "reboot", dry_run=True),
               action(mine, "repair", expires_at=int(time.time() * 1000) - 1000)]  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all")
    topic = topic_name(kafka_settings, "actions")
    for act in actions:
        key = f"{CLUSTER}/{act.target.name}".encode()
        producer.send(topic, key=key, value=codec.encode(act)).get(timeout=30)
    current = Action.__struct_config__.tag  # the current action schema, with a bad body
    bad = b'{"schema": "%s", "kind": "zap"}' % str(current).encode()
    producer.send(topic, key=b"x/y", value=bad).get(30)
    producer.close()

    run = _fleetpulse(kafka_settings, kube, "actuate", "kubernetes", "--idle-exit", "3")
    assert run.returncode == 0, run.stderr
    echoes = [codec.decode(v, NodeEvent) for v in _read(kafka_settings, "events.node")]
    # in order per target (one key, one partition); no echo for the dry run
    assert [(e.kind, e.action_id) for e in echoes if e.target == mine] == [
        ("cordoned", actions[0].action_id), ("drained", actions[1].action_id),
        ("skipped", actions[4].action_id)]
    assert [(e.kind, e.action_id) for e in echoes if e.target == held] == [
        ("held", actions[2].action_id)]
    (letter,) = [codec.decode(v, DeadLetter) for v in _read(kafka_settings, "dlq")]
    assert "kind" in letter.error or "action_id" in letter.error
    # the health machine takes every echo (held becomes a human hold)
    state = None
    for echo in echoes:
        state, _ = transition(state, echo, HealthSettings()) if echo.target == held else (state, [])
    assert state is not None and state.human_hold

    again = _fleetpulse(kafka_settings, kube, "actuate", "kubernetes", "--idle-exit", "2")
    assert again.returncode == 0, again.stderr
    assert "0 records" in again.stdout  # committed: nothing came again


def test_the_watcher_command_sends_inventory_events_and_tombstones(
    kafka_settings: KafkaSettings, kube: Kube
) -> None:
    created = _fleetpulse(kafka_settings, kube, "topics", "create")
    assert created.returncode == 0, created.stderr
    before = kube.node(labels={"cloud.google.com/gke-nodepool": "a3"})
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka_settings.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka_settings.topic_prefix,
           "FLEETPULSE_METRICS__PORT": "0", "FLEETPULSE_KUBERNETES__KUBECONFIG": kube.kubeconfig,
           "FLEETPULSE_KUBERNETES__CLUSTER": CLUSTER,
           "FLEETPULSE_KUBERNETES__WATCH_TIMEOUT_S": "5"}  # fmt: skip
    watcher = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "watch", "kubernetes"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        key = f"{CLUSTER}/{before}".encode()
        deadline = time.monotonic() + 60
        while not any(k == key for k, _ in _records(kafka_settings, "inventory")):
            assert watcher.poll() is None, watcher.communicate()
            assert time.monotonic() < deadline, "no inventory record from the first list"
        kube.core.patch_node(before, {"spec": {"unschedulable": True}},
                             _content_type="application/merge-patch+json")
        kube.core.delete_node(before)
        deadline = time.monotonic() + 60
        while True:
            kinds = [codec.decode(v, NodeEvent).kind for k, v in _records(kafka_settings, "events.node")
                     if k == key and v is not None]  # fmt: skip
            if kinds == ["cordoned", "deleted"]:
                break
            assert time.monotonic() < deadline, kinds
        assert (key, None) in _records(kafka_settings, "inventory")  # the tombstone
        assert (key, None) in _records(kafka_settings, "node-state")
    finally:
        watcher.terminate()
        out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert "watcher:" in out


def _records(kafka: KafkaSettings, suffix: str) -> list[tuple[bytes, bytes | None]]:
    consumer = KafkaConsumer(topic_name(kafka, suffix), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=2000)  # fmt: skip
    try:
        return [(record.key, record.value) for record in consumer]
    finally:
        consumer.close()
