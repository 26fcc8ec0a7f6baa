"""A receiver cannot stall alert delivery (issue 33): `fleetpulse alerts` as a process on the
real broker, with three webhook targets: one healthy, one answering 500, one dripping its
answer a byte every 2 s (each byte inside any read timeout).

Before: the dripping receiver held every target's alerts while /readyz said ready. Now each
POST ends at its deadline, each target has its own queue, so the healthy one gets every alert
within a second or two; /readyz and fleetpulse_alerts_target_stalled name the two bad ones;
the offsets wait for them, and once they recover they get every alert: nothing is lost."""

from __future__ import annotations

import json
import re
import statistics
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from pipeline.config import KafkaSettings
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import encode
from pipeline.wire.topics import topic_name
from tests.faults.infra import Proc, base_env, wait_until
from tests.faults.reliability import record
from tests.integration.test_alert_targets import Receiver, _alert

pytestmark = pytest.mark.kafka
ALERTS = 20
EVERY_S = 0.25  # the trickle: one alert this often
STALLED_AFTER_S = 5.0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read().decode()


def _stalled(port: int) -> dict[str, float]:
    text = _get(port, "/metrics")[1]
    found = re.findall(r'fleetpulse_alerts_target_stalled\{target="webhook ([^"]+)"\} (\S+)', text)
    return {url: float(value) for url, value in found}


def test_a_receiver_dripping_one_byte_every_2_s(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    healthy, failing, drip = Receiver("ok"), Receiver("fail"), Receiver("drip", drip_s=2.0)
    urls = [healthy.url, failing.url, drip.url]
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path,
                   FLEETPULSE_ALERTS__WEBHOOK_URLS=json.dumps(urls),
                   FLEETPULSE_ALERTS__TIMEOUT_S="3", FLEETPULSE_ALERTS__MAX_ATTEMPTS="2",
                   FLEETPULSE_ALERTS__BACKOFF_INITIAL_S="0.2",
                   FLEETPULSE_ALERTS__BACKOFF_MAX_S="1",
                   FLEETPULSE_ALERTS__STALLED_AFTER_S=str(STALLED_AFTER_S))
    proc = Proc("alerts", ["alerts"], env, tmp_path / "alerts.log").start()
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    run = uuid.uuid4().hex[:8]
    try:
        wait_until(proc.ready, 60, "alerts joined its group", proc)
        port = proc.readyz_port()
        sent: dict[str, float] = {}
        for n in range(ALERTS):
            alert = _alert(n, run)
            producer.send(topic_name(kafka, "alerts"), key=alert.fingerprint.encode(),
                          value=encode(alert)).get(timeout=30)
            sent[alert.fingerprint] = time.time()
            time.sleep(EVERY_S)
        first = min(sent.values())
        wait_until(lambda: healthy.fingerprints() >= set(sent), 30, "healthy got every alert",
                   proc)
        arrived = {alert["fingerprint"]: at for at, alert in healthy.got}
        delays = [arrived[fingerprint] - at for fingerprint, at in sent.items()]

        named = [f"webhook {failing.url} stalled", f"webhook {drip.url} stalled"]
        wait_until(lambda: all(n in _get(port, "/readyz")[1] for n in named), 30,
                   "/readyz names both stalled targets", proc)
        reported_after = time.time() - first
        status, why = _get(port, "/readyz")
        stalled = _stalled(port)
        held = drip.fingerprints() | failing.fingerprints()

        failing.mode = drip.mode = "ok"
        recovery = wait_until(
            lambda: failing.fingerprints() >= set(sent) and drip.fingerprints() >= set(sent),
            60, "the recovered targets got every alert", proc)
        wait_until(lambda: _get(port, "/readyz")[0] == 200, 30, "ready again", proc)
    finally:
        producer.close()
        code = proc.stop()
        for receiver in (healthy, failing, drip):
            receiver.close()
    lost = sum(len(set(sent) - r.fingerprints()) for r in (healthy, failing, drip))
    record("control", "a receiver dripping one byte every 2 s", {
        "alerts in": ALERTS,
        "healthy target delay max s": round(max(delays), 2),
        "healthy target delay median s": round(statistics.median(delays), 2),
        "stalled named on /readyz after s": round(reported_after, 1),
        "lost": lost,
        "recovery s": round(recovery, 2),
    })
    assert code == 0, proc.tail()
    assert max(delays) < 2.0, delays  # the 500 and the drip delay it by nothing
    assert status == 503 and healthy.url not in why, why
    assert stalled == {healthy.url: 0.0, failing.url: 1.0, drip.url: 1.0}, stalled
    assert held == set()  # nothing reached the bad targets while they were bad
    assert lost == 0
