"""Alert delivery cannot be stalled: real HTTP receivers (healthy, answering 500, dripping
their answer a byte at a time) behind `fleetpulse alerts` on the real broker.

A dripping receiver is cut at the delivery deadline and read no further than the cap; one slow
or failing target never delays the others' alerts; /readyz and /metrics name the stalled one;
the offsets wait for it, so nothing is lost: its alerts arrive once it recovers, or go to
fleet.dlq when its queue is full."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest
import requests

from pipeline.commands.alerts import RunStats, build_sinks, run_alerts
from pipeline.config import AlertSettings, MetricsSettings, Settings, WebhookTarget
from pipeline.model import Alert, DeadLetter
from pipeline.selfmetrics import Readiness, serve_stats
from pipeline.sinks import signing as webhooks
from pipeline.sinks.alert_targets import AlertStats
from pipeline.sinks.webhook import DeliveryError, JsonPoster
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode, encode
from pipeline.wire.edge import EdgeStats
from pipeline.wire.topics import topic_name

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Receiver:
    """A webhook receiver on a free port whose `mode` may change while it runs: "ok" (200),
    "fail" (500) or "drip" (the 200 answer one byte every `drip_s`, never a read timeout).
    `got` holds (arrival time, alert) of every alert it answered 2xx for."""

    def __init__(self, mode: str = "ok", drip_s: float = 2.0, secret: str | None = None) -> None:
        self.mode, self.drip_s, self.secret = mode, drip_s, secret
        self.got: list[tuple[float, dict[str, Any]]] = []
        self.posts = 0
        self.verified = 0
        self.sent = 0  # bytes of answer bodies written ("huge" mode)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.posts += 1
                if outer.secret is not None:
                    webhooks.verify(dict(self.headers.items()), raw, outer.secret)
                    outer.verified += 1
                getattr(outer, f"_{outer.mode}")(self, raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _ok(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        now = time.time()
        self.got += [(now, alert) for alert in json.loads(raw)["alerts"]]
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _fail(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        body = b"upstream down"
        handler.send_response(500)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _drip(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        handler.close_connection = True
        try:
            for byte in ANSWER:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(self.drip_s)
        except OSError:
            return  # cut by the sender
        self.got += [(time.time(), alert) for alert in json.loads(raw)["alerts"]]

    def _huge(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        handler.send_response(400)
        handler.send_header("Content-Length", str(1 << 30))  # a gigabyte of error page
        handler.end_headers()
        chunk = b"x" * 65536
        try:
            while self.sent < 1 << 30:
                handler.wfile.write(chunk)
                self.sent += len(chunk)
        except OSError:
            return

    def fingerprints(self) -> set[str]:
        return {alert["fingerprint"] for _, alert in list(self.got)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(mode: str = "ok", drip_s: float = 2.0, secret: str | None = None) -> Receiver:
        made.append(Receiver(mode, drip_s, secret))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def _alert(n: int, run: str) -> Alert:
    return Alert(
        ts=int(time.time() * 1000),
        fingerprint=f"{run}{n:08x}",
        status="firing",
        labels={"alertname": "FleetPulseNodeCordoned", "severity": "critical",
                "node": f"gpu-node-{n:03d}"},
        annotations={"summary": f"gpu-node-{n:03d} cordoned"},
        startsAt="2026-01-01T00:00:00.000Z",
    )


# --- one POST: a deadline for the whole, a cap on what is read ------------------------------


def test_a_dripping_receiver_is_cut_at_the_deadline(receivers: Callable[..., Receiver]) -> None:
    drip = receivers("drip", drip_s=0.2)  # each byte well within a 1 s read timeout
    poster = JsonPoster(timeout_s=1.0, max_attempts=2, backoff_initial_s=0.1, backoff_max_s=0.1)
    started = time.monotonic()
    with pytest.raises(DeliveryError) as failed:
        poster.post(drip.url, {"alerts": []})
    elapsed = time.monotonic() - started
    # two attempts of 1 s each and one backoff, where the answer alone would take 11 s each
    assert elapsed < 2.8, elapsed
    assert not failed.value.permanent and drip.posts == 2
    assert "within the 1 s deadline (alerts.timeout_s)" in str(failed.value)


def test_an_answer_is_read_no_further_than_the_cap(receivers: Callable[..., Receiver]) -> None:
    huge = receivers("huge")
    poster = JsonPoster(timeout_s=5.0, max_attempts=1)
    started = time.monotonic()
    with pytest.raises(DeliveryError) as refused:
        poster.post(huge.url, {"alerts": []})
    assert refused.value.permanent and refused.value.status == 400
    assert "'xxxx" in str(refused.value) and len(str(refused.value)) < 500
    assert time.monotonic() - started < 3
    time.sleep(0.5)  # the receiver's writes fail once our socket is gone
    assert huge.sent < 64 << 20  # of the gigabyte offered: no more than the socket buffers


def test_each_target_signs_with_its_own_key(receivers: Callable[..., Receiver],
                                            tmp_path: Any) -> None:
    shared, own = (f"whsec_{base64.b64encode(bytes([n]) * 32).decode()}" for n in (1, 2))
    key_file = tmp_path / "own"
    key_file.write_text(own + "\n")
    with_shared, with_own = receivers(secret=shared), receivers(secret=own)
    alerts = AlertSettings(webhook_secret=shared, webhook_urls=[with_shared.url],
                           webhooks=[WebhookTarget(url=with_own.url, secret_file=str(key_file))])
    for sink in build_sinks(Settings(alerts=alerts)):
        sink.deliver([_alert(1, "k")])
    assert (with_shared.verified, with_own.verified) == (1, 1)


# --- the alerts process on the real broker -------------------------------------------------


class Running:
    """`run_alerts` in a thread, with /metrics and /readyz on a free port."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.stop = settings, threading.Event()
        self.edge_stats, self.alert_stats, readiness = EdgeStats(), AlertStats(), Readiness()
        port = serve_stats("alerts", self.edge_stats, MetricsSettings(host="127.0.0.1", port=0),
                           readiness, extra=[self.alert_stats])
        self.base = f"http://127.0.0.1:{port}"
        self.result: list[RunStats] = []
        self.thread = threading.Thread(target=lambda: self.result.append(run_alerts(
            settings, build_sinks(settings), stop=self.stop, stats=self.edge_stats,
            alert_stats=self.alert_stats, readiness=readiness)), daemon=True)
        self.thread.start()

    def readyz(self) -> tuple[int, str]:
        answer = requests.get(f"{self.base}/readyz", timeout=5)
        return answer.status_code, answer.text

    def stalled(self) -> dict[str, float]:
        """fleetpulse_alerts_target_stalled by target URL."""
        text = requests.get(f"{self.base}/metrics", timeout=5).text
        found = re.findall(r'fleetpulse_alerts_target_stalled\{target="webhook ([^"]+)"\} (\S+)',
                           text)
        return {url: float(value) for url, value in found}

    def finish(self) -> RunStats:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.result[0]


def _settings(settings: Settings, urls: list[str], **alerts: Any) -> Settings:
    section = AlertSettings(group_id=f"alerts-{uuid.uuid4().hex[:8]}", webhook_urls=urls,
                            timeout_s=1.0, max_attempts=1, backoff_initial_s=0.1,
                            backoff_max_s=0.5, **alerts)
    return msgspec.structs.replace(settings, alerts=section)


def _produce(settings: Settings, alerts: list[Alert]) -> dict[str, float]:
    """Send the alerts; when each was acknowledged (time.time())."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    topic, sent = topic_name(settings.kafka, "alerts"), {}
    for alert in alerts:
        producer.send(topic, key=alert.fingerprint.encode(), value=encode(alert)).get(timeout=30)
        sent[alert.fingerprint] = time.time()
    producer.close()
    return sent


def _committed(settings: Settings) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap,
                             group_id=settings.alerts.group_id, enable_auto_commit=False)
    try:
        topic = topic_name(settings.kafka, "alerts")
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        return sum(consumer.committed(tp) or 0 for tp in partitions)
    finally:
        consumer.close()


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def _dead_letters(settings: Settings, at_least: int) -> list[DeadLetter]:
    """fleet.dlq's letters about fleet.alerts: at least `at_least`, and all there are then."""
    from kafka import KafkaConsumer

    dlq = KafkaConsumer(topic_name(settings.kafka, "dlq"),
                        bootstrap_servers=settings.kafka.bootstrap, auto_offset_reset="earliest")
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 20
    source = topic_name(settings.kafka, "alerts")
    while time.monotonic() < deadline:
        polled = dlq.poll(timeout_ms=1000).values()
        if not polled and len(letters) >= at_least:
            break
        for records in polled:
            letters += [letter for letter in (decode(r.value, DeadLetter) for r in records)
                        if letter.topic == source]
    dlq.close()
    return letters


@pytest.fixture
def kafka_settings_with_topics(settings: Settings) -> Settings:
    create_topics(settings.kafka)
    return settings


def test_a_stalled_target_delays_no_other_and_loses_nothing(
    kafka_settings_with_topics: Settings, receivers: Callable[..., Receiver]
) -> None:
    healthy, failing, drip = receivers("ok"), receivers("fail"), receivers("drip", drip_s=0.5)
    settings = _settings(kafka_settings_with_topics, [healthy.url, failing.url, drip.url],
                         stalled_after_s=2.0)
    run = uuid.uuid4().hex[:8]
    first = [_alert(n, run) for n in range(3)]
    running = Running(settings)
    try:
        _produce(settings, first)  # the member joins its group with these
        _until(lambda: healthy.fingerprints() >= {a.fingerprint for a in first}, 30, "joined")
        later = [_alert(n, run) for n in range(3, 13)]
        sent = _produce(settings, later)
        _until(lambda: healthy.fingerprints() >= set(sent), 10, "healthy got the later alerts")
        arrived = {alert["fingerprint"]: at for at, alert in healthy.got}
        delays = [arrived[fingerprint] - at for fingerprint, at in sent.items()]
        assert max(delays) < 2.0, delays  # the 500 and the drip delay it by nothing

        # the two bad targets hold their alerts: stalled on /metrics and /readyz, commit held
        named = [f"webhook {failing.url} stalled", f"webhook {drip.url} stalled"]
        _until(lambda: all(n in running.readyz()[1] for n in named), 10, "/readyz names both")
        status, text = running.readyz()
        assert status == 503
        assert "HTTP 500" in text and "deadline" in text  # each one's last error
        assert healthy.url not in text
        _until(lambda: running.stalled().get(drip.url) == 1.0, 5, "the drip's gauge")
        assert running.stalled() == {healthy.url: 0.0, failing.url: 1.0, drip.url: 1.0}
        assert _committed(settings) < len(first) + len(later)
        assert failing.fingerprints() == set() and drip.fingerprints() == set()

        failing.mode = drip.mode = "ok"  # both recover: every alert arrives, then the commit
        every = {a.fingerprint for a in first + later}
        _until(lambda: failing.fingerprints() == every and drip.fingerprints() == every, 20,
               "the recovered targets got every alert")
        _until(lambda: _committed(settings) == len(every), 10, "everything committed")
        _until(lambda: running.readyz()[0] == 200, 5, "ready again")
        assert running.stalled() == {healthy.url: 0.0, failing.url: 0.0, drip.url: 0.0}
    finally:
        stats = running.finish()
    assert stats.alerts == 13 and stats.dead_letters == 0 and stats.retries >= 2


def test_a_full_queue_sends_the_oldest_to_the_dead_letter_and_the_commit_moves_on(
    kafka_settings_with_topics: Settings, receivers: Callable[..., Receiver]
) -> None:
    healthy, drip = receivers("ok"), receivers("drip", drip_s=0.5)
    settings = _settings(kafka_settings_with_topics, [healthy.url, drip.url],
                         stalled_after_s=1.0, target_queue_max=3)
    run = uuid.uuid4().hex[:8]
    alerts = [_alert(n, run) for n in range(12)]
    running = Running(settings)
    try:
        _produce(settings, alerts)
        every = {a.fingerprint for a in alerts}
        _until(lambda: healthy.fingerprints() == every, 30, "healthy got every alert")
        letters = _dead_letters(settings, at_least=1)
        assert letters and {letter.reason for letter in letters} == {"target_stalled"}
        assert all(f"webhook {drip.url}: not delivered, more than 3 alerts waiting"
                   in letter.error for letter in letters)
        # at most 3 alerts wait at the stalled target (the last ones read): the commit passed
        # the rest, those delivered or given up
        _until(lambda: _committed(settings) >= len(alerts) - 3, 10, "commit past the letters")
        drip.mode = "ok"
        _until(lambda: _committed(settings) == len(alerts), 20, "everything committed")
        letters = _dead_letters(settings, at_least=1)
    finally:
        running.finish()
    lettered = {decode(base64.b64decode(letter.raw_b64), Alert).fingerprint
                for letter in letters}
    # nothing lost: each alert reached the slow target or its dead letter
    assert drip.fingerprints() | lettered == every
