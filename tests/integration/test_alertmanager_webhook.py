"""The webhook sink against a local HTTP receiver: only 2xx is delivered, retries as promised,
signed webhooks verify at the receiver, auth headers are sent, redirects are refused."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest
import requests
import requests.auth

from pipeline.model import Alert
from pipeline.sinks import signing as webhooks
from pipeline.sinks.webhook import (
    BearerAuth,
    DeliveryError,
    JsonPoster,
    Target,
    WebhookSink,
    webhook_id,
)

SECRET = "whsec_" + base64.b64encode(b"a 32-byte secret for the tests!!").decode()

ALERT = Alert(
    ts=1_764_424_804_213,
    fingerprint="8f14e45fceea167a",
    status="firing",
    labels={"alertname": "FleetPulseNodeCordoned", "node": "gpu-node-1", "severity": "critical"},
    annotations={"summary": "gpu-node-1 cordoned"},
    startsAt="2025-11-29T14:00:04.213Z",
)


class Scripted:
    """Answers each POST with the next (status, headers) of its script, then 200."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str]]] = []
        self.gets = 0
        self.bodies: list[Any] = []
        self.raw: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                outer.raw.append(raw)
                outer.headers.append(dict(self.headers.items()))
                outer.bodies.append(json.loads(raw))
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # what requests would turn a followed 301/302 into
                outer.gets += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Scripted]:
    scripted = Scripted()
    yield scripted
    scripted.server.shutdown()
    scripted.server.server_close()


def _sink(url: str | Target, delays: list[float], attempts: int = 4) -> WebhookSink:
    poster = JsonPoster(
        timeout_s=5,
        max_attempts=attempts,
        backoff_initial_s=0.5,
        backoff_max_s=4.0,
        sleep=delays.append,
    )
    return WebhookSink(url, poster)


def test_payload_is_alertmanager_webhook_format(receiver: Scripted) -> None:
    delivered = _sink(receiver.url, []).deliver([ALERT])
    assert (delivered.status, delivered.attempts) == (200, 1)
    [body] = receiver.bodies
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["commonLabels"] == ALERT.labels
    [alert] = body["alerts"]
    assert alert["fingerprint"] == ALERT.fingerprint
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"


def test_server_errors_are_retried_with_backoff(receiver: Scripted) -> None:
    receiver.script = [(503, {}), (500, {}), (429, {"Retry-After": "3"})]
    delays: list[float] = []
    delivered = _sink(receiver.url, delays).deliver([ALERT])
    assert delivered.attempts == 4
    # exponential with jitter (each in [d/2, d]), then exactly the server's Retry-After
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0 and delays[2] == 3.0
    assert len(receiver.bodies) == 4


def test_client_errors_are_not_retried(receiver: Scripted) -> None:
    receiver.script = [(400, {})]
    delays: list[float] = []
    with pytest.raises(DeliveryError) as refused:
        _sink(receiver.url, delays).deliver([ALERT])
    assert refused.value.permanent and refused.value.status == 400
    assert delays == [] and len(receiver.bodies) == 1


def test_redirects_and_other_non_2xx_are_not_delivered(receiver: Scripted) -> None:
    receiver.script = [(304, {})]
    with pytest.raises(DeliveryError) as refused:
        _sink(receiver.url, []).deliver([ALERT])
    assert refused.value.status == 304


def test_unreachable_receiver_is_a_transient_failure() -> None:
    delays: list[float] = []
    with pytest.raises(DeliveryError) as failed:
        _sink("http://127.0.0.1:9/hook", delays, attempts=3).deliver([ALERT])
    assert not failed.value.permanent
    assert len(delays) == 2 and 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0


def _signing() -> Any:
    key = webhooks.signer(SECRET)
    return lambda msg_id, body: webhooks.sign_headers(msg_id, body, key)


def test_a_signed_alert_verifies_at_the_receiver(receiver: Scripted) -> None:
    poster = JsonPoster(timeout_s=5, max_attempts=3, backoff_initial_s=0.01, sleep=lambda s: None)
    receiver.script = [(503, {})]  # one retry: each attempt is signed afresh, same id
    WebhookSink(receiver.url, poster, _signing()).deliver([ALERT])
    seen: set[str] = set()
    first, second = zip(receiver.headers, receiver.raw, strict=True)
    assert first[0]["webhook-id"] == second[0]["webhook-id"] == webhook_id([ALERT])
    webhooks.verify(second[0], second[1], SECRET, seen_ids=seen)
    with pytest.raises(webhooks.ReplayedWebhookError):  # the retry a receiver already has
        webhooks.verify(first[0], first[1], SECRET, seen_ids=seen)
    tampered = second[1].replace(b"gpu-node-1", b"gpu-node-2")
    with pytest.raises(webhooks.WebhookVerificationError):
        webhooks.verify(second[0], tampered, SECRET)


def test_the_webhook_id_follows_the_alerts() -> None:
    resolved = msgspec.structs.replace(ALERT, status="resolved", ts=ALERT.ts + 60_000)
    assert webhook_id([ALERT]) == webhook_id([ALERT])  # a replay: the same id
    assert webhook_id([resolved]) != webhook_id([ALERT])  # a new state: a new message


def test_bearer_and_basic_auth_are_sent(receiver: Scripted) -> None:
    _sink(Target(receiver.url, auth=BearerAuth("t0k3n-abc")), []).deliver([ALERT])
    basic = requests.auth.HTTPBasicAuth("alice", "pw")
    _sink(Target(receiver.url, auth=basic), []).deliver([ALERT])
    assert [h["Authorization"] for h in receiver.headers] == [
        "Bearer t0k3n-abc",
        "Basic " + base64.b64encode(b"alice:pw").decode(),
    ]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_a_refusal_not_a_delivery(status: int, receiver: Scripted) -> None:
    elsewhere = Scripted()  # where the redirect points: must see nothing
    try:
        receiver.script = [(status, {"Location": elsewhere.url + "?token=leaked-t0ken"})]
        delays: list[float] = []
        with pytest.raises(DeliveryError) as refused:
            _sink(receiver.url, delays).deliver([ALERT])
        assert refused.value.permanent and refused.value.status == status
        assert f"HTTP {status} redirecting to" in str(refused.value)
        assert "leaked-t0ken" not in str(refused.value)
        assert len(receiver.bodies) == 1 and delays == [] and receiver.gets == 0
        assert elsewhere.bodies == [] and elsewhere.gets == 0
    finally:
        elsewhere.server.shutdown()
        elsewhere.server.server_close()
