"""Self-metrics of the worker, served on /metrics (prometheus-client, own registry).

One registry per app, so two apps in one process (tests) never collide. Labels are bounded:
topic names, agent names, finding checks and action kinds — never node names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from pipeline.config import MetricsSettings
from pipeline.decide import alerts, guard
from pipeline.model import ActionKind
from pipeline.selfmetrics import Ready
from pipeline.selfmetrics import serve as serve_http

log = logging.getLogger("fleetpulse.worker")
# The alerts (and actions) the Helm chart's PrometheusRule and dashboard count with increase():
# each starts at 0, because increase() sees nothing of a series whose first sample is already
# 1, so without it the first FleetPulseBudgetExhausted of a worker's life never fired.
COUNTED_ALERTS = (*(name for name, _ in alerts.POOL_ALERTS.values()), alerts.CORDONED,
                  alerts.MAINTENANCE, guard.COMMON_CAUSE, guard.NO_INVENTORY)  # fmt: skip


def _registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=_registry)

    def __post_init__(self) -> None:
        r = self.registry
        self.records_in = Counter(
            "fleetpulse_worker_records_in", "Records consumed", ["topic"], registry=r
        )
        self.values_in = Counter(
            "fleetpulse_worker_values_in",
            "Values handled: a record's own, or each of a batch record's (producers batch their "
            "telemetry by default, so records_in counts far fewer)", ["topic"], registry=r
        )
        self.records_out = Counter(
            "fleetpulse_worker_records_out", "Records produced", ["topic"], registry=r
        )
        self.dead_letters = Counter(
            "fleetpulse_worker_dead_letters",
            "Records sent to the dead-letter topic, by reason (tombstone, too_large, too_deep, "
            "invalid, error, and the door's: ahead, behind, late, inventory_mismatch)",
            ["topic", "reason"],
            registry=r,
        )
        self.tombstones = Counter(
            "fleetpulse_worker_tombstones",
            "Null values on the compacted inventory topic (a target left): processed, not errors",
            ["topic"],
            registry=r,
        )
        self.unknown_targets = Counter(
            "fleetpulse_worker_unknown_targets",
            "Telemetry of targets the inventory does not know (processed, never removed)",
            registry=r,
        )
        self.impossible_values = Counter(
            "fleetpulse_worker_impossible_values",
            "Values no working device reports (PCIe width 0, every metric 0, a port state "
            "outside its enum), taken out before detection as missing data",
            registry=r,
        )
        self.errors = Counter(
            "fleetpulse_worker_errors",
            "Unexpected exceptions while processing a record (the record is dead-lettered)",
            ["agent"],
            registry=r,
        )
        self.findings = Counter(
            "fleetpulse_worker_findings", "Findings produced", ["check", "healthy"], registry=r
        )
        self.actions = Counter(
            "fleetpulse_worker_actions", "Actions produced", ["kind", "dry_run"], registry=r
        )
        self.alerts = Counter(
            "fleetpulse_worker_alerts",
            "Alerts produced, by status and alertname (FleetPulseBudgetExhausted, "
            "FleetPulseCommonCause, ...: the PrometheusRule of the Helm chart watches these)",
            ["status", "alertname"],
            registry=r,
        )
        for name in COUNTED_ALERTS:
            for status in ("firing", "resolved"):
                self.alerts.labels(status, name)
        for kind in get_args(ActionKind):
            for dry_run in ("true", "false"):
                self.actions.labels(kind, dry_run)
        self.roll_backs = Counter(
            "fleetpulse_worker_roll_backs",
            "Stage states put back after a record or staleness check raised half-way",
            ["table"],
            registry=r,
        )
        self.state_resets = Counter(
            "fleetpulse_worker_state_resets",
            "Table values that could not be decoded and were started afresh",
            ["table"],
            registry=r,
        )
        self.lag = Gauge(
            "fleetpulse_worker_consumer_lag",
            "Records between the end of a partition and the next one to process",
            ["topic", "partition"],
            registry=r,
        )
        # what a backlog could make grow, set with the lag (tests/faults/test_infra_backpressure)
        self.held = Gauge(
            "fleetpulse_worker_held_records",
            "Records an agent's Aligner holds for event-time order (at most ALIGN_MAX_HELD + 1)",
            ["agent"],
            registry=r,
        )
        self.cached_states = Gauge(
            "fleetpulse_worker_cached_states",
            "Decoded key states kept in memory (the keys of the assigned partitions in use)",
            registry=r,
        )
        self.unsettled = Gauge(
            "fleetpulse_worker_unsettled_batches",
            "Batches of outputs waiting for the broker's acknowledgement (bounded by the Settler)",
            registry=r,
        )
        # process_resident_memory_bytes and friends, with the worker's prefix
        ProcessCollector(namespace="fleetpulse_worker", registry=r)
        self.latency = Histogram(
            "fleetpulse_worker_processing_seconds",
            "Time to process one record (decode, pure functions, state, queue outputs)",
            ["agent"],
            buckets=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
            registry=r,
        )
        self.settle = Histogram(
            "fleetpulse_worker_settle_seconds",
            "Time from queuing a batch of outputs to the broker acknowledging them all",
            buckets=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
            registry=r,
        )


def serve(metrics: WorkerMetrics, settings: MetricsSettings, ready: Ready) -> tuple[str, int]:
    """Serve /metrics, /healthz and /readyz (pipeline.selfmetrics.serve); a taken port is a
    ListenError. Returns the (host, port) bound."""
    return serve_http("worker", metrics.registry, settings, ready)
