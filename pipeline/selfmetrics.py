"""Self-metrics for the long-running processes other than the worker (lake sink, ingest,
alerts): their own running counters, served on /metrics with prometheus-client.

Each loop already keeps a small stats object; a collector reads it at scrape time, so the hot
loop pays nothing and the numbers on /metrics are the ones the process logs when it stops.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("fleetpulse.metrics")


class StatsCollector:
    """Exposes every int field of a stats dataclass as `fleetpulse_<process>_<field>_total`."""

    def __init__(self, process: str, stats: Any) -> None:
        self.process, self.stats = process, stats
        self.started = time.time()

    def collect(self) -> Iterator[Metric]:
        for field in dataclasses.fields(self.stats):
            value = getattr(self.stats, field.name)
            if isinstance(value, int):
                name = f"fleetpulse_{self.process}_{field.name}"
                yield CounterMetricFamily(name, f"{self.process}: {field.name}", value=value)
        yield GaugeMetricFamily(
            f"fleetpulse_{self.process}_start_time_seconds",
            "Unix time the process started",
            value=self.started,
        )


def serve_stats(process: str, stats: Any, port: int) -> int:
    """Serve `stats` on /metrics; a busy configured port falls back to a free one (logged),
    so a second process on one host never fails to start over its metrics. Returns the port."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(process, stats))  # type: ignore[arg-type]
    try:
        server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError as exc:
        log.warning("metrics port %d unavailable (%s); using a free port", port, exc)
        server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    bound: int = server.server_port
    log.info("%s: self-metrics on http://127.0.0.1:%d/metrics", process, bound)
    return bound
