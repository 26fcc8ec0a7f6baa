"""No secret in logs or fleet.dlq: `fleetpulse alerts` on the real broker with credentialed
targets that refuse (one echoes our Authorization header and URL back, one redirects to a URL
with a token), then every log line and dead letter is searched for the secret values."""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.commands.alerts import build_sinks, run_alerts
from pipeline.config import AlertSettings, HttpClientSettings, Settings, WebhookTarget
from pipeline.model import Alert, DeadLetter
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode, encode
from pipeline.wire.topics import topic_name

pytestmark = pytest.mark.kafka

URL_PASSWORD = "pw-Url-Userinfo-51"
QUERY_TOKEN = "qTok-Query-7731"
PATH_TOKEN = "PathTok3nSlack99"
BEARER = "bearer-From-File-204"
REDIRECT_TOKEN = "redir-Loc-Token-66"
SIGNING = base64.b64encode(b"signing secret for the dlq test!").decode()
SECRETS = [URL_PASSWORD, QUERY_TOKEN, PATH_TOKEN, BEARER, REDIRECT_TOKEN, SIGNING]


class Refusing:
    """/echo answers 400 quoting the request line and Authorization; /moved answers 302."""

    def __init__(self) -> None:
        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.posts += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.startswith("/moved"):
                    self.send_response(302)
                    self.send_header("Location", f"https://x.example/in?token={REDIRECT_TOKEN}")
                    body = b""
                else:
                    self.send_response(400)
                    echo = f"bad request {self.path}; Authorization: {self.headers['Authorization']}"
                    body = echo.encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def refusing() -> Iterator[Refusing]:
    running = Refusing()
    yield running
    running.server.shutdown()
    running.server.server_close()


def _alert(node: str) -> Alert:
    ts = int(time.time() * 1000)
    return Alert(
        ts=ts,
        fingerprint=uuid.uuid4().hex[:16],
        status="firing",
        labels={"alertname": "FleetPulseNodeCordoned", "severity": "critical", "node": node},
        annotations={"summary": f"{node} cordoned"},
        startsAt="2026-01-01T00:00:00.000Z",
    )


def test_credentials_never_reach_logs_or_dead_letters(
    settings: Settings,
    refusing: Refusing,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    token_file = tmp_path / "bearer"
    token_file.write_text(BEARER + "\n")
    secret_file = tmp_path / "signing"
    secret_file.write_text(f"whsec_{SIGNING}\n")
    base = f"http://127.0.0.1:{refusing.port}"
    alerts = AlertSettings(
        group_id=f"alerts-{uuid.uuid4().hex[:8]}",
        max_attempts=1,
        backoff_initial_s=0.1,
        webhook_urls=[f"http://ops:{URL_PASSWORD}@127.0.0.1:{refusing.port}/moved"],
        webhooks=[
            WebhookTarget(
                url=f"{base}/services/T0AB12CD/B0EF34GH/{PATH_TOKEN}?token={QUERY_TOKEN}",
                bearer_token_file=str(token_file),
            )
        ],
        webhook_secret_file=str(secret_file),
        alertmanager_http=HttpClientSettings(),
    )
    settings = msgspec.structs.replace(settings, alerts=alerts)
    create_topics(settings.kafka)
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    topic = topic_name(settings.kafka, "alerts")
    alert = _alert(f"gpu-node-{uuid.uuid4().hex[:6]}")
    producer.send(topic, key=alert.fingerprint.encode(), value=encode(alert)).get(timeout=30)
    producer.close()

    caplog.set_level(logging.DEBUG)
    stats = run_alerts(settings, build_sinks(settings), idle_exit_s=2.0)
    assert stats.alerts == 1 and stats.dead_letters == 2 and refusing.posts == 2

    dlq = KafkaConsumer(
        topic_name(settings.kafka, "dlq"),
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
    )
    raw: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(raw) < 2 and time.monotonic() < deadline:
        for records in dlq.poll(timeout_ms=500).values():
            raw += [record.value for record in records]
    dlq.close()
    letters = [decode(value, DeadLetter) for value in raw]
    # the alert is not lost: one letter per refusing target, with a reason a person can act on
    assert sorted(letter.reason for letter in letters) == ["refused", "refused"]
    errors = " | ".join(letter.error for letter in letters)
    assert "HTTP 302 redirecting to" in errors and "HTTP 400" in errors
    assert "Bearer ***" in errors  # the receiver's echo, masked

    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "refused 1 alerts" in logged
    written = logged + "\n" + "\n".join(value.decode() for value in raw)
    leaked = [secret for secret in SECRETS if secret in written]
    assert leaked == []
