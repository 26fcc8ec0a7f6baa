"""A GCE metadata server stand-in for one simulated host: plain HTTP, the real semantics.

Serves `/computeMetadata/v1/instance/{name, zone, preempted, maintenance-event}` and
`instance/attributes/{cluster-name, kube-labels}` (as GKE writes them). Like the real server it
answers only requests with `Metadata-Flavor: Google` (403 otherwise), stamps every answer with
that header and an `ETag`, and with `?wait_for_change=true` holds the request until the value's
ETag differs from `last_etag` (at once when it already does) or `timeout_sec` passes.

Its state follows the simulator: a MAINTENANCE_SCHEDULED for the host sets the window, and
maintenance-event reads TERMINATE_ON_HOST_MAINTENANCE (GPU hosts do not live-migrate) from 60 s
before the window start (`advance(ts)` moves its clock; a MAINTENANCE_STARTED sets it too) until
MAINTENANCE_DONE; a PREEMPTION sets preempted TRUE until the node is created again.
"""

from __future__ import annotations

import hashlib
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

from pipeline.model import CapacityEvent
from pipeline.sim.endpoints.stand_in import HttpStandIn

NOTICE_MS = 60_000  # maintenance-event changes about 60 s before the window (§6.4)
MAX_WAIT_S = 300.0
PREFIX = "/computeMetadata/v1/"


class MetadataServerStandIn(HttpStandIn):
    thread_name = "metadata"

    def __init__(
        self,
        *,
        name: str,
        zone: str,
        cluster: str,
        pool: str,
        project_number: int = 123456789012,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._values: dict[str, str] = {
            "instance/name": name,
            "instance/zone": f"projects/{project_number}/zones/{zone}",
            "instance/attributes/cluster-name": cluster,
            "instance/attributes/kube-labels": f"cloud.google.com/gke-nodepool={pool},"
            f"cloud.google.com/gke-accelerator-count=8",
            "instance/maintenance-event": "NONE",
            "instance/preempted": "FALSE",
        }
        self._window_start: int | None = None
        self._changed = threading.Condition()
        self._listen(host, port, _handler_for(self))

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- state from the simulator -------------------------------------------------------------

    def set(self, path: str, value: str) -> None:
        with self._changed:
            if self._values.get(path) != value:
                self._values[path] = value
                self._changed.notify_all()

    def value(self, path: str) -> tuple[str, str] | None:
        with self._changed:
            if path not in self._values:
                return None
            value = self._values[path]
            return value, _etag(value)

    @property
    def pending(self) -> bool:
        return self._window_start is not None

    def advance(self, ts: int) -> None:
        """The simulated clock reached `ts`: the notice shows 60 s before the window."""
        if self._window_start is not None and ts >= self._window_start - NOTICE_MS:
            self._window_start = None
            self.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")

    def record_capacity(self, event: CapacityEvent) -> None:
        if event.kind == "MAINTENANCE_SCHEDULED" and event.window is not None:
            self._window_start = event.window.start
        elif event.kind == "MAINTENANCE_STARTED":
            self._window_start = None
            self.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        elif event.kind == "MAINTENANCE_DONE":
            self._window_start = None
            self.set("instance/maintenance-event", "NONE")
        elif event.kind == "PREEMPTION":
            self.set("instance/preempted", "TRUE")
        self.advance(event.ts)

    def recreated(self) -> None:
        self.set("instance/preempted", "FALSE")
        self.set("instance/maintenance-event", "NONE")

    # -- serving ------------------------------------------------------------------------------

    def wait(self, path: str, last_etag: str | None, timeout_s: float) -> tuple[str, str] | None:
        """The value once its ETag differs from `last_etag` (without one: once it changes),
        or as it is after `timeout_s`."""
        with self._changed:
            if last_etag is None:
                last_etag = _etag(self._values.get(path, ""))
            self._changed.wait_for(
                lambda: path in self._values and _etag(self._values[path]) != last_etag,
                timeout=min(timeout_s, MAX_WAIT_S),
            )
        return self.value(path)

    def stop(self) -> None:
        with self._changed:  # wake long polls, so the server's threads can end
            self._changed.notify_all()
        super().stop()



def _etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _handler_for(server: MetadataServerStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Metadata-Flavor") != "Google":
                self._answer(403, "Missing required header: 'Metadata-Flavor: Google'\n", "")
                return
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            path = url.path.removeprefix(PREFIX) if url.path.startswith(PREFIX) else None
            if path is None:
                self._answer(404, "not found\n", "")
                return
            if query.get("wait_for_change") == "true":
                timeout = float(query.get("timeout_sec", MAX_WAIT_S))
                found = server.wait(path, query.get("last_etag"), timeout)
            else:
                found = server.value(path)
            if found is None:
                self._answer(404, "not found\n", "")
                return
            self._answer(200, found[0], found[1])

        def _answer(self, code: int, body: str, etag: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: http.server would log every request of a test to stderr."""

    return Handler
