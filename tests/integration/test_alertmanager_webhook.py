"""The webhook sink against a local HTTP receiver: only 2xx is delivered, retries as promised."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pipeline.model import Alert
from pipeline.sinks.webhook import DeliveryError, JsonPoster, WebhookSink

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
        self.bodies: list[Any] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
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


def _sink(url: str, delays: list[float], attempts: int = 4) -> WebhookSink:
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
