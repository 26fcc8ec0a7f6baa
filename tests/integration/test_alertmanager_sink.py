"""Our sink → a real Alertmanager (deploy/alertmanager, on a free port) → a local webhook receiver.

Also `fleetpulse alerts` end to end: alert records on a real Kafka topic are delivered and
their offsets committed only after Alertmanager answered 2xx.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
import requests

from pipeline.config import AlertSettings, Settings
from pipeline.ids import stable_id
from pipeline.model import Alert, DeadLetter
from pipeline.sinks.alertmanager import AlertmanagerSink
from pipeline.sinks.webhook import DeliveryError, JsonPoster
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode, encode
from pipeline.wire.topics import topic_name

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "alertmanager" / "alertmanager.sh"
pytestmark = pytest.mark.alertmanager


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Receiver:
    """A webhook receiver: records every JSON body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for body in list(self.bodies):
                if predicate(body):
                    return body
            time.sleep(0.1)
        raise AssertionError(f"no matching notification; received {self.bodies}")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.server.shutdown()


@pytest.fixture(scope="module")
def alertmanager(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    env = {
        **os.environ,
        "ALERTMANAGER_PORT": str(port),
        "ALERTMANAGER_WEBHOOK_URL": receiver.url,
        "ALERTMANAGER_GROUP_WAIT": "1s",
        "ALERTMANAGER_GROUP_INTERVAL": "1s",
        "ALERTMANAGER_CACHE_DIR": str(tmp_path_factory.mktemp("alertmanager")),
    }
    subprocess.run(["bash", str(SCRIPT), "start"], env=env, check=True, timeout=90)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, check=True, timeout=60)


def _alert(node: str, status: str = "firing", ts: int | None = None) -> Alert:
    ts = ts or int(time.time() * 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts / 1000)) + f".{ts % 1000:03d}Z"
    return Alert(
        ts=ts,
        fingerprint=stable_id("a", node).split("-")[1],
        status=status,  # type: ignore[arg-type]
        labels={"alertname": "FleetPulseNodeCordoned", "severity": "critical", "node": node},
        annotations={"summary": f"{node} cordoned: GPU 0 fell off the bus (XID 79)"},
        startsAt=stamp,
        endsAt=stamp if status == "resolved" else None,
    )


def _active(alertmanager: str) -> list[dict[str, Any]]:
    response = requests.get(f"{alertmanager}/api/v2/alerts", timeout=5)
    response.raise_for_status()
    alerts: list[dict[str, Any]] = response.json()
    return alerts


def _poster() -> JsonPoster:
    return JsonPoster(timeout_s=5, max_attempts=2, backoff_initial_s=0.1)


def test_alert_reaches_alertmanager_and_is_routed_to_the_webhook(
    alertmanager: str, receiver: Receiver
) -> None:
    node = f"gpu-node-{uuid.uuid4().hex[:6]}"
    sink = AlertmanagerSink(alertmanager, _poster())
    delivered = sink.deliver([_alert(node)])
    assert 200 <= delivered.status < 300

    [stored] = [a for a in _active(alertmanager) if a["labels"].get("node") == node]
    assert stored["labels"]["alertname"] == "FleetPulseNodeCordoned"
    assert stored["status"]["state"] == "active"
    assert "GPU 0 fell off the bus" in stored["annotations"]["summary"]

    def about(status: str) -> Callable[[dict[str, Any]], bool]:
        return lambda body: any(
            a["labels"].get("node") == node and a["status"] == status for a in body["alerts"]
        )

    fired = receiver.wait_for(about("firing"))
    assert fired["receiver"] == "fleetpulse-webhook"

    sink.deliver([_alert(node, "resolved")])
    receiver.wait_for(about("resolved"))
    assert not [a for a in _active(alertmanager) if a["labels"].get("node") == node]


def test_alertmanager_refusal_is_permanent(alertmanager: str) -> None:
    bad = msgspec.structs.replace(_alert("gpu-node-x"), labels={})  # no label pair: refused
    with pytest.raises(DeliveryError) as refused:
        AlertmanagerSink(alertmanager, _poster()).deliver([bad])
    assert refused.value.permanent and refused.value.status == 400


def _settings(settings: Settings, **alerts: Any) -> Settings:
    group = f"alerts-{uuid.uuid4().hex[:8]}"
    section = AlertSettings(group_id=group, max_attempts=1, backoff_initial_s=0.1, **alerts)
    return msgspec.structs.replace(settings, alerts=section)


def _committed(settings: Settings) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap,
        group_id=settings.alerts.group_id,
        enable_auto_commit=False,
    )
    try:
        topic = topic_name(settings.kafka, "alerts")
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        return sum(consumer.committed(tp) or 0 for tp in partitions)
    finally:
        consumer.close()


def test_alerts_command_commits_only_after_delivery(
    settings: Settings, alertmanager: str, receiver: Receiver
) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    from pipeline.commands.alerts import build_sinks, run_alerts

    create_topics(settings.kafka)
    nodes = [f"gpu-node-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    topic = topic_name(settings.kafka, "alerts")
    for node in nodes:
        alert = _alert(node)
        producer.send(topic, key=alert.fingerprint.encode(), value=encode(alert)).get(timeout=30)
    producer.send(topic, key=b"junk", value=b'{"schema": "alert/1", "ts": 5}').get(timeout=30)
    producer.close()

    # Alertmanager unreachable: retried, no alert committed, nothing lost (the junk record is
    # dead-lettered at once, and committed when no held alert comes before it in its partition)
    down = _settings(settings, alertmanager_url=f"http://127.0.0.1:{_free_port()}")
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    stats = run_alerts(down, build_sinks(down), stop=stop)
    assert stats.retries >= 1 and stats.alerts == 0
    assert _committed(down) <= 1

    up = _settings(settings, alertmanager_url=alertmanager)
    up = msgspec.structs.replace(
        up, alerts=msgspec.structs.replace(up.alerts, group_id=down.alerts.group_id)
    )
    stats = run_alerts(up, build_sinks(up), idle_exit_s=2.0)
    assert stats.alerts == 2 and stats.dead_letters <= 1  # junk again, if it was not committed
    assert _committed(up) == 3
    active = {a["labels"].get("node") for a in _active(alertmanager)}
    assert set(nodes) <= active

    dlq = KafkaConsumer(
        topic_name(settings.kafka, "dlq"),
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
    )
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 20
    while not letters and time.monotonic() < deadline:
        for records in dlq.poll(timeout_ms=500).values():
            letters += [decode(record.value, DeadLetter) for record in records]
    for records in dlq.poll(timeout_ms=1000).values():  # and nothing more after it
        letters += [decode(record.value, DeadLetter) for record in records]
    dlq.close()
    assert {(letter.topic, letter.key) for letter in letters} == {(topic, "junk")}
    assert "expected" in letters[0].error and "got" in letters[0].error
