"""FleetPulse over SASL_SSL on a real broker: kafka.sh's secure profile, started here.

The module starts its own broker (`KAFKA_SECURE=1 deploy/kafka/kafka.sh start` on free ports:
a per-run CA and broker certificate, SCRAM users, StandardAuthorizer ACLs), so it runs from a
fresh clone under `make test` next to the plaintext broker the other tests use. Every process
runs as its component's own principal (pipeline/wire/acl.py); `admin` (a super user) stands in
for the fleet where a test feeds it (`simulate`, produced events).
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.errors import TopicAuthorizationFailedError

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.model import Action, NodeEvent
from pipeline.sim import read_truth
from pipeline.wire import codec
from pipeline.wire.acl import ROLES, Grant, markdown
from pipeline.wire.group_topics import group_name, group_topics
from pipeline.wire.kafka import client_kwargs
from pipeline.wire.topics import TOPICS, topic_name
from streams.testing import WorkerProcess, create_topics, produce_events, scenario, worker_env
from tests.kube_fixture import Kube

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
README = REPO / "deploy" / "kafka" / "README.md"
# the topic prefixes the module's broker grants the principals (one per test's topics)
PREFIXES = ("fleet", "rt", "wk", "e2e", "kube")


@dataclass(frozen=True)
class SecureBroker:
    plain_port: int
    secure_port: int
    files: Path  # CA, per-user password files, fleetpulse.env

    def settings(self, user: str = "admin", **extra: object) -> KafkaSettings:
        return KafkaSettings(
            bootstrap=f"127.0.0.1:{self.secure_port}",
            partitions=2,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=user,
            sasl_password_file=str(self.files / f"{user}.password"),
            ssl_cafile=str(self.files / "ca.pem"),
            **extra,  # type: ignore[arg-type]
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_secure_broker(prefixes: tuple[str, ...]) -> Iterator[SecureBroker]:
    """kafka.sh's secure profile on free ports, its ACLs for the topic prefixes given."""
    plain, controller, secure = _free_port(), _free_port(), _free_port()
    env = {
        **os.environ,
        "KAFKA_SECURE": "1",
        "KAFKA_PORT": str(plain),
        "KAFKA_CONTROLLER_PORT": str(controller),
        "KAFKA_SECURE_PORT": str(secure),
        "KAFKA_ACL_PREFIXES": ",".join(prefixes),
        "KAFKA_HEAP_OPTS": "-Xms256m -Xmx384m",
        "PYTHON": sys.executable,  # kafka.sh creates the ACLs with the project's client
    }
    start = subprocess.run(["bash", str(KAFKA_SH), "start"], env=env, capture_output=True,
                           text=True, timeout=240, check=False)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield SecureBroker(plain, secure, REPO / ".cache" / "kafka" / f"secure-{plain}")
    finally:
        subprocess.run(["bash", str(KAFKA_SH), "stop"], env=env, capture_output=True,
                       timeout=120, check=False)


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[SecureBroker]:
    with running_secure_broker(PREFIXES) as broker:
        yield broker


def _env(kafka: KafkaSettings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_")}
    env.update({
        "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
        "FLEETPULSE_KAFKA__PARTITIONS": str(kafka.partitions),
        "FLEETPULSE_KAFKA__SECURITY_PROTOCOL": kafka.security_protocol,
        "FLEETPULSE_KAFKA__SASL_MECHANISM": kafka.sasl_mechanism,
        "FLEETPULSE_KAFKA__SASL_USERNAME": kafka.sasl_username,
        "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE": kafka.sasl_password_file,
        "FLEETPULSE_KAFKA__SSL_CAFILE": kafka.ssl_cafile,
    })
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _end_offsets(kafka: KafkaSettings, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(**client_kwargs(kafka))
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: n for tp, n in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def test_topics_create_and_a_round_trip_over_sasl_ssl(secure_broker: SecureBroker) -> None:
    """The chart's topics Job's principal creates every topic; the worker's writes a finding,
    the lake sink's reads it in its own group (group ACLs, offset commits)."""
    topics = secure_broker.settings("fleetpulse-topics", topic_prefix="rt")
    done = _cli("topics", "create", env=_env(topics, FLEETPULSE_KAFKA__TOPIC_PREFIX="rt"))
    assert done.returncode == 0, done.stdout + done.stderr
    # every topic FleetPulse declares, and the default worker group's
    every = len(TOPICS) + len(group_topics(topics, group_name(topics)))
    created = f"{every} created, 0 already present"
    assert f"{created} on 127.0.0.1:{secure_broker.secure_port}" in done.stdout
    worker = secure_broker.settings("fleetpulse-worker", topic_prefix="rt")
    topic = topic_name(worker, "findings")
    producer = KafkaProducer(**client_kwargs(worker), acks="all")
    sent = producer.send(topic, key=b"node-1", value=b"over-tls").get(timeout=30)
    producer.close()
    lake = secure_broker.settings("fleetpulse-lake", topic_prefix="rt")
    consumer = KafkaConsumer(topic, **client_kwargs(lake), group_id="fleetpulse-lake",
                             auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    values = [m.value for _, m in zip(range(1), consumer, strict=False)]  # one, then stop
    consumer.commit()
    consumer.close()
    assert values == [b"over-tls"]
    # aiokafka (the client under faust), its own TLS context from the same settings
    assert _aiokafka_read(lake, topic, sent.partition) == [b"over-tls"]


def _aiokafka_read(kafka: KafkaSettings, topic: str, partition: int) -> list[bytes]:
    import asyncio

    async def read() -> list[bytes]:
        consumer = AIOKafkaConsumer(**client_kwargs(kafka, "aiokafka"), group_id=None)
        await consumer.start()
        try:
            tp = AioPartition(topic, partition)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            batch = await consumer.getmany(tp, timeout_ms=20_000)
            return [m.value for m in batch.get(tp, []) if m.value is not None]
        finally:
            await consumer.stop()

    return asyncio.run(read())


def test_a_wrong_password_fails_fast_naming_listener_and_mechanism(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    kafka = secure_broker.settings("fleetpulse-topics")
    env = _env(kafka, FLEETPULSE_KAFKA__SASL_PASSWORD_FILE=str(wrong))
    started = time.monotonic()
    done = _cli("topics", "create", env=env)
    took = time.monotonic() - started
    assert done.returncode != 0
    listener = (f"127.0.0.1:{secure_broker.secure_port} "
                "(SASL_SSL, SCRAM-SHA-512 as 'fleetpulse-topics')")
    assert f"Kafka refused the SASL login at {listener}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "not-the-password" not in done.stderr
    assert took < 15, f"took {took:.1f} s"  # not the clients' 30 s bootstrap timeout


def test_an_unknown_ca_is_a_clear_tls_error(secure_broker: SecureBroker, tmp_path: Path) -> None:
    other_ca = tmp_path / "other.pem"  # a CA that did not sign the broker certificate
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=other", "-keyout", str(tmp_path / "k"), "-out", str(other_ca)],
                   capture_output=True, check=True, timeout=60)
    env = _env(secure_broker.settings("fleetpulse-topics"),
               FLEETPULSE_KAFKA__SSL_CAFILE=str(other_ca))
    done = _cli("topics", "create", env=env)
    assert done.returncode != 0
    assert "TLS handshake with 127.0.0.1" in done.stderr and "CERTIFICATE_VERIFY_FAILED" in (
        done.stderr
    ), done.stderr


def test_the_xid_reader_is_refused_writing_actions_and_nothing_lands(
    secure_broker: SecureBroker,
) -> None:
    """The XID DaemonSet's principal (root on every GPU node) writes XID events, not actions;
    every role against every topic: tests/faults/test_control_principals.py."""
    admin = secure_broker.settings(topic_prefix="fleet")
    assert _cli("topics", "create", env=_env(admin)).returncode == 0
    xid = secure_broker.settings("fleetpulse-ingest-xid", topic_prefix="fleet")
    # default retries: a just-created topic may answer NotLeader once; authorization
    # errors are not retried, so the refusal still comes at once
    producer = KafkaProducer(**client_kwargs(xid), acks="all")
    try:
        producer.send(topic_name(xid, "events.xid"), value=b"xid").get(timeout=30)  # its own
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(topic_name(xid, "actions"), value=b"forged").get(timeout=30)
    finally:
        producer.close()
    assert sum(_end_offsets(admin, topic_name(admin, "actions")).values()) == 0
    assert sum(_end_offsets(admin, topic_name(admin, "events.xid")).values()) >= 1


def test_people_and_the_xid_reader_run_as_their_own_principals(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """`inventory load`, `policy release` and `ingest xid` as the principals the chart and the
    README give them: each command does its work within its ACLs (the inventory and policy
    commands read their topic's configs first; the XID reader dead-letters a line it cannot
    parse), and the operator cannot load an inventory."""
    admin = secure_broker.settings(topic_prefix="fleet")
    topics = _env(secure_broker.settings("fleetpulse-topics", topic_prefix="fleet"),
                  FLEETPULSE_KAFKA__TOPIC_PREFIX="fleet")  # fmt: skip
    assert _cli("topics", "create", env=topics).returncode == 0
    before = {s: sum(_end_offsets(admin, topic_name(admin, s)).values())
              for s in ("inventory", "events.policy", "events.xid", "dlq")}  # fmt: skip
    now = int(time.time() * 1000)
    inventory = tmp_path / "inventory.jsonl"
    inventory.write_text(json.dumps({
        "schema": "inventory/1", "ts": now, "cluster": "gke-1", "kind": "node",
        "name": "gpu-node-1", "pool": "a3-pool", "zone": "us-central1-a",
        "accelerator": "H100", "capacity": 8}) + "\n")  # fmt: skip

    def run(user: str, *args: str) -> subprocess.CompletedProcess[str]:
        kafka = secure_broker.settings(user, topic_prefix="fleet")
        env = _env(kafka, FLEETPULSE_KAFKA__TOPIC_PREFIX="fleet",
                   FLEETPULSE_SOURCES__NODE="gpu-node-1", FLEETPULSE_SOURCES__CLUSTER="gke-1",
                   FLEETPULSE_SOURCES__STATE_DIR=str(tmp_path / "state"))  # fmt: skip
        return _cli(*args, env=env)

    loaded = run("fleetpulse-inventory", "inventory", "load", str(inventory))
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    released = run("fleetpulse-operator", "policy", "release", "--scope", "fleet",
                   "--check", "node.down", "--by", "test", "--reason", "principals")  # fmt: skip
    assert released.returncode == 0, released.stdout + released.stderr
    assert run("fleetpulse-operator", "inventory", "load", str(inventory)).returncode != 0
    log = tmp_path / "kern.log"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    log.write_text(
        f"{stamp} gpu-node-1 kernel: NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen "
        "off the bus.\n"
        f"{stamp} gpu-node-1 kernel: NVRM: Xid (PCI:0000:53:00): not-a-code\n"
    )
    xid = run("fleetpulse-ingest-xid", "ingest", "xid", "--once", "--log", str(log))
    assert xid.returncode == 0, xid.stdout + xid.stderr
    after = {s: sum(_end_offsets(admin, topic_name(admin, s)).values()) for s in before}
    assert {s: after[s] - before[s] for s in before} == {
        "inventory": 1, "events.policy": 1, "events.xid": 1, "dlq": 1}


def test_the_actuator_and_the_watcher_run_as_their_own_principals(
    secure_broker: SecureBroker, kube: Kube, tmp_path: Path
) -> None:
    """On the real API server: the worker's principal writes an action, the actuator's reads
    it in its own group (fleetpulse-actuator-<cluster>) and echoes the outcome on
    fleet.events.node, and the watcher's lists the node into fleet.inventory."""
    from tests.integration.test_kubernetes_actuator import CLUSTER, action

    def env(user: str) -> dict[str, str]:
        kafka = secure_broker.settings(user, topic_prefix="kube")
        return _env(kafka, FLEETPULSE_KAFKA__TOPIC_PREFIX="kube", FLEETPULSE_METRICS__PORT="0",
                    FLEETPULSE_KUBERNETES__KUBECONFIG=kube.kubeconfig,
                    FLEETPULSE_KUBERNETES__CLUSTER=CLUSTER,
                    FLEETPULSE_KUBERNETES__WATCH_TIMEOUT_S="5")  # fmt: skip

    assert _cli("topics", "create", env=env("fleetpulse-topics")).returncode == 0
    node = kube.node(labels={"cloud.google.com/gke-nodepool": "a3",
                             "topology.kubernetes.io/zone": "z-a"})  # fmt: skip
    act = action(node, "cordon")
    worker = secure_broker.settings("fleetpulse-worker", topic_prefix="kube")
    producer = KafkaProducer(**client_kwargs(worker), acks="all")
    producer.send(topic_name(worker, "actions"), key=f"{CLUSTER}/{node}".encode(),
                  value=codec.encode(act)).get(timeout=30)  # fmt: skip
    producer.close()
    run = _cli("actuate", "kubernetes", "--idle-exit", "3", env=env("fleetpulse-actuator"))
    assert run.returncode == 0, run.stdout + run.stderr
    admin = secure_broker.settings(topic_prefix="kube")
    echoes = [codec.decode(v, NodeEvent) for _, v in _records(admin, "events.node") if v]
    assert act.action_id in {e.action_id for e in echoes if e.target == node}, echoes

    watcher = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "watch", "kubernetes"],
                               env=env("fleetpulse-watcher"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while f"{CLUSTER}/{node}".encode() not in {k for k, _ in _records(admin, "inventory")}:
            assert watcher.poll() is None, watcher.communicate()
            assert time.monotonic() < deadline, "no inventory record from the watcher's list"
    finally:
        watcher.terminate()
        _, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err


def _records(kafka: KafkaSettings, suffix: str) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value) on the topic, read from the start to its end."""
    topic = topic_name(kafka, suffix)
    consumer = KafkaConsumer(**client_kwargs(kafka), group_id=None)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        found: list[tuple[bytes, bytes | None]] = []
        while any(consumer.position(p) < end for p, end in ends.items()):
            for records in consumer.poll(timeout_ms=500).values():
                found += [(r.key, r.value) for r in records]
        return found
    finally:
        consumer.close()


def test_the_broker_holds_exactly_the_acls_of_the_role_table(secure_broker: SecureBroker) -> None:
    """kafka.sh applied pipeline/wire/acl.py's grants and nothing else (the README's table is
    written from the same table: test_the_readme_acl_table_is_the_role_table)."""
    sys.path.insert(0, str(KAFKA_SH.parent))
    try:
        from secure_acls import profile_grants  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(KAFKA_SH.parent))
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{secure_broker.plain_port}")
    try:
        found, error = admin.describe_acls(ACLFilter(
            None, None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY)))
    finally:
        admin.close()
    assert error is None or error.errno == 0, error
    held = sorted(
        Grant(acl.principal, acl.operation.name, acl.resource_pattern.resource_type.name,
              acl.resource_pattern.resource_name,
              acl.resource_pattern.pattern_type == ACLResourcePatternType.PREFIXED)
        for acl in found
        if acl.permission_type == ACLPermissionType.ALLOW and acl.host == "*"
    )
    assert len(held) == len(found), "an ACL that is not an ALLOW for every host"
    assert held == profile_grants(list(PREFIXES))
    assert {g.principal for g in held} == {f"User:{role.principal}" for role in ROLES}


def test_the_readme_acl_table_is_the_role_table() -> None:
    from pipeline.docs_markers import read_section

    written = read_section(README, "kafka-acls").strip()
    assert written == markdown(), "run `python -m pipeline.wire.acl --write`"


def test_the_worker_processes_records_over_sasl_ssl(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """The worker as its own principal: its topic checks, internal topics, group and outputs
    all within its ACLs."""
    kafka = secure_broker.settings("fleetpulse-worker", topic_prefix="wk")
    settings: Settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    env = worker_env(settings, tmp_path)
    create_topics(_as(env, secure_broker, "fleetpulse-topics"))
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        worker.wait_for(r"fleetpulse worker: assigned .*telemetry\.gpu=0,1", 180)
        events = [e for e in scenario().events() if getattr(e, "ts", 0) < 1_767_225_630_000]
        fleet = secure_broker.settings(topic_prefix="wk")  # admin stands in for the adapters
        produce_events(msgspec.structs.replace(settings, kafka=fleet), events)
        gpu = topic_name(kafka, "telemetry.gpu")
        _wait_for_processed(worker, sum(_end_offsets(fleet, gpu).values()), gpu)
    finally:
        code = worker.stop(timeout=60)
    assert code == 0, worker.tail()


def _as(env: dict[str, str], broker: SecureBroker, user: str) -> dict[str, str]:
    """`env` with the SASL user and password file of another principal."""
    return {**env, "FLEETPULSE_KAFKA__SASL_USERNAME": user,
            "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE": str(broker.files / f"{user}.password")}


def _wait_for_processed(worker: WorkerProcess, count: int, topic: str) -> None:
    url = f"http://127.0.0.1:{worker.metrics_port()}/metrics"
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(url, timeout=10) as response:
            lines = response.read().decode().splitlines()
        seen = sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith("fleetpulse_worker_records_in_total{") and f'"{topic}"' in line
        )
        if count and seen >= count:
            return
        assert time.monotonic() < deadline, f"{seen} of {count} records read:\n{worker.tail()}"
        time.sleep(0.3)


class _Webhook(http.server.BaseHTTPRequestHandler):
    """A local alert receiver: keeps every JSON body posted to it."""

    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _actions_for(kafka: KafkaSettings, node: str, deadline: float) -> list[Action]:
    """The actions on fleet.actions that target `node`, read until one arrives."""
    consumer = KafkaConsumer(topic_name(kafka, "actions"), **client_kwargs(kafka),
                             group_id=None, auto_offset_reset="earliest")
    found: list[Action] = []
    try:
        while not found and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                actions = [codec.decode(r.value, Action) for r in records if r.value]
                found += [a for a in actions if a.target.name == node]
    finally:
        consumer.close()
    return found


def test_the_whole_pipeline_end_to_end_over_sasl_ssl(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """simulate --to kafka → worker → sink lake and alerts (to a local webhook), every process
    a subprocess speaking SASL_SSL with SCRAM to the secure listener as its own principal
    (simulate as admin: it stands in for every adapter)."""
    started = time.monotonic()
    kafka = secure_broker.settings("fleetpulse-worker", topic_prefix="e2e")
    settings: Settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    env = worker_env(settings, tmp_path / "worker")
    create_topics(_as(env, secure_broker, "fleetpulse-topics"))
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    _Webhook.bodies = []
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        worker.wait_for(r"fleetpulse worker: assigned .*telemetry\.gpu=0,1", 180)
        # an HBM failure (DBE + XID 48): a fatal fault the policy cordons at once
        sim = _cli("simulate", "--to", "kafka", "--out", str(tmp_path / "sim"),
                   "--duration", "240", "--gpu-nodes", "2", "--tpu-slices", "0",
                   "--no-random-faults", "--inject", "G5/hbm@60", "--seed", "7", "--quiet",
                   env=_as(env, secure_broker, "admin"))
        assert sim.returncode == 0, sim.stdout + sim.stderr
        [fault] = [f for f in read_truth(tmp_path / "sim" / "events.truth.jsonl") if f.forced]
        node = fault.target.name
        actions = _actions_for(secure_broker.settings(topic_prefix="e2e"), node,
                               time.monotonic() + 60)
        assert "cordon" in {a.kind for a in actions}, worker.tail()

        lake = tmp_path / "lake"
        port = receiver.server_address[1]
        outputs = {
            "lake": [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake),
                     "--exit-when-idle", "4"],
            "alerts": [sys.executable, "-m", "pipeline.cli", "alerts", "--idle-exit", "4"],
        }
        sink_env = {**env, "FLEETPULSE_ALERTS__WEBHOOK_URLS": f'["http://127.0.0.1:{port}/hook"]'}
        procs = {name: subprocess.Popen(cmd, env=_as(sink_env, secure_broker, f"fleetpulse-{name}"),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for name, cmd in outputs.items()}
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=90)
            assert proc.returncode == 0, f"{name}:\n{out}"
    finally:
        receiver.shutdown()
        receiver.server_close()
        code = worker.stop(timeout=60)
    assert code == 0, worker.tail()

    rows = duckdb.connect().execute(
        f"select target_name, kind from read_parquet('{lake}/actions/**/*.parquet')"
    ).fetchall()
    assert (node, "cordon") in rows, rows
    delivered = [a for body in _Webhook.bodies for a in body["alerts"]]
    cordons = [a for a in delivered if a["labels"]["alertname"] == "FleetPulseTargetCordoned"]
    assert node in {a["labels"].get("node") for a in cordons}, delivered
    print(f"simulate → worker → lake, alerts over SASL_SSL in {time.monotonic() - started:.1f}s")
