"""The listening side of every long-running process (worker, lake sink, ingest, alerts):
/metrics (prometheus-client), /healthz (the process is alive) and /readyz (it is doing its
job: connected to Kafka, or for the worker assigned and caught up), for Prometheus and
Kubernetes probes.

The processes other than the worker expose their own running counters: each loop already
keeps a small stats object; a collector reads it at scrape time, so the hot loop pays nothing
and the numbers on /metrics are the ones the process logs when it stops.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler

from pipeline.config import MetricsSettings
from pipeline.errors import ListenError

log = logging.getLogger("fleetpulse.metrics")

# what /readyz answers: ready or not, and a short reason for whoever reads the probe's body
Ready = Callable[[], tuple[bool, str]]


@dataclasses.dataclass
class Readiness:
    """/readyz of a process whose Kafka client is made after the server starts: not ready
    until the loop sets `check` (asked at each probe, from the HTTP thread)."""

    check: Ready | None = None

    def __call__(self) -> tuple[bool, str]:
        return (False, "starting") if self.check is None else self.check()


def consumer_readiness(consumer: Any, group: str) -> tuple[bool, str]:
    """Ready once a kafka-python consumer is a stable member of its group: it reached the
    broker and the coordinator; holding no partition (more members than partitions) is still
    ready, so a standby does not hold up a rollout."""
    from kafka.structs import MemberState  # the Kafka client only where Kafka is used

    state = consumer.group_metadata().state
    if state != MemberState.STABLE:
        return False, f"not a member of group {group} yet (state {state})"
    # the member stays "stable" while the broker is away: a coordinator that answered no
    # heartbeat for a few intervals means we cannot reach Kafka
    silent = _heartbeat_silence(consumer)
    if silent is not None:
        return False, f"no heartbeat answered for {silent:.0f} s (Kafka unreachable?)"
    return True, f"joined group {group}"


def _heartbeat_silence(consumer: Any) -> float | None:
    """Seconds since the group coordinator last answered a heartbeat (or we joined), when that
    is over two intervals plus a second; None otherwise. kafka-python keeps this only in its
    coordinator's heartbeat state: read defensively, a version without it counts as answered."""
    heartbeat = getattr(getattr(consumer, "_coordinator", None), "heartbeat", None)
    last = max(getattr(heartbeat, "last_receive", None) or 0.0,
               getattr(heartbeat, "last_reset", None) or 0.0)
    if heartbeat is None or last <= 0:
        return None
    interval_s = consumer.config.get("heartbeat_interval_ms", 3000) / 1000
    silent = time.monotonic() - last
    return silent if silent > 2 * interval_s + 1 else None


def _handler(registry: CollectorRegistry, ready: Ready) -> type[MetricsHandler]:
    class Handler(MetricsHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlparse(self.path).path
            if path == "/metrics":
                super().do_GET()
                return
            if path == "/healthz":
                self._answer(200, "ok")  # the process answers: it is alive
            elif path == "/readyz":
                ok, reason = ready()
                self._answer(200 if ok else 503, ("ready: " if ok else "not ready: ") + reason)
            else:
                self._answer(404, "not found: /metrics, /healthz, /readyz")

        def _answer(self, status: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    Handler.registry = registry
    return Handler


def serve(
    process: str,
    registry: CollectorRegistry,
    settings: MetricsSettings,
    ready: Ready,
) -> tuple[str, int]:
    """Serve /metrics, /healthz and /readyz in a daemon thread on metrics.host and the port
    of `process` (see MetricsSettings.port_for). A taken or forbidden port is a ListenError
    naming the port and the setting: two processes must never share, or silently swap, the
    address Prometheus and the kubelet were told about. Returns the (host, port) bound."""
    host, port = settings.host, settings.port_for(process)
    setting = "metrics.port (FLEETPULSE_METRICS__PORT)"
    if settings.port is None:
        setting += f", unset: {process}'s default {port}"
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ListenError(
            f"metrics.host {host!r} (FLEETPULSE_METRICS__HOST) is not an address: {exc}"
        ) from None

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    try:
        server = Server((host, port), _handler(registry, ready))
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise ListenError(
            f"cannot listen on {host}:{port} for /metrics: {why}; set {setting} "
            "to a free port (0 = any free port)"
        ) from None
    threading.Thread(target=server.serve_forever, name=f"{process}-http", daemon=True).start()
    bound: int = server.server_port
    return host, bound


class StatsCollector:
    """Exposes every int field of a stats dataclass as `fleetpulse_<process>_<field>_total`.

    Field metadata widens that: `{"gauge": True}` on an int field makes it a gauge named
    `fleetpulse_<process>_<field>` (a state such as "writes blocked", not a count), and
    `{"label": "reason"}` on a dict[str, int] field makes one labelled counter,
    `fleetpulse_<process>_<field>_total{reason="…"}` (with `"gauge": True` too, a labelled
    gauge: `fleetpulse_alerts_target_stalled{target="…"}`).
    """

    def __init__(self, process: str, stats: Any) -> None:
        self.process, self.stats = process, stats
        self.started = time.time()

    def collect(self) -> Iterator[Metric]:
        for field in dataclasses.fields(self.stats):
            value = getattr(self.stats, field.name)
            name = f"fleetpulse_{self.process}_{field.name}"
            described = f"{self.process}: {field.name}"
            label = field.metadata.get("label")
            if field.metadata.get("gauge") and isinstance(value, int):
                yield GaugeMetricFamily(name, described, value=value)
            elif isinstance(value, int):
                yield CounterMetricFamily(name, described, value=value)
            elif label and isinstance(value, dict):
                family = GaugeMetricFamily if field.metadata.get("gauge") else CounterMetricFamily
                counter = family(name, described, labels=[label])
                for key, count in sorted(value.copy().items()):  # the loop may add keys
                    counter.add_metric([key], count)
                yield counter
        yield GaugeMetricFamily(
            f"fleetpulse_{self.process}_start_time_seconds",
            "Unix time the process started",
            value=self.started,
        )


class _ExtraStats(StatsCollector):
    """A second stats object of the same process: no second start_time_seconds."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if not metric.name.endswith("_start_time_seconds"):
                yield metric


def serve_stats(
    process: str, stats: Any, settings: MetricsSettings, ready: Ready, extra: Sequence[Any] = ()
) -> int:
    """Serve `stats` on /metrics, with /healthz and /readyz (see serve); `extra` stats objects
    too (a Kafka edge's counters and its sink's own, say: their field names must differ).
    Returns the port."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(process, stats))  # type: ignore[arg-type]
    for more in extra:
        registry.register(_ExtraStats(process, more))  # type: ignore[arg-type]
    host, bound = serve(process, registry, settings, ready)
    log.info("%s: /metrics, /healthz, /readyz on http://%s:%d", process, host, bound)
    return bound
