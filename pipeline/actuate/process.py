"""An actuator as a process: the wiring `fleetpulse actuate kubernetes|slurm` share.

Stats and /metrics first (so /healthz answers while the runtime connects), then the runtime's
actuator, its echo producer and sink, the Kafka loop until SIGTERM (or `idle_exit_s`), and a
one-line summary. `alongside` runs beside the loop with the same stop event (the Kubernetes
releaser: people win).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.actuate.base import ActuatorStats, BaseActuator
from pipeline.actuate.kafka import ActuatorSink, Producer, run_actuator
from pipeline.config import Settings
from pipeline.selfmetrics import Readiness, serve_stats
from pipeline.wire.edge import EdgeStats, stop_on_signals


def run_actuator_process(
    settings: Settings,
    *,
    name: str,
    client: str,
    group: str,
    stats: ActuatorStats,
    make: Callable[[ActuatorStats], BaseActuator[Any]],
    idle_exit_s: float | None,
    extra_stats: Sequence[Any] = (),
    alongside: Callable[[threading.Event], None] | None = None,
) -> EdgeStats:
    """Run the `name` actuator (`make` builds it around `stats`, the runtime's own counters;
    its echoes go out as client `client`) until stopped."""
    edge_stats, readiness = EdgeStats(), Readiness()
    serve_stats(f"actuate_{name}", edge_stats, settings.metrics, readiness,
                extra=[stats, *extra_stats])  # fmt: skip
    actuator = make(stats)
    producer = Producer(settings, f"{settings.kafka.client_id}-{client}")
    sink = ActuatorSink(actuator, producer.send, settings.kafka.max_value_bytes)
    stop = threading.Event()
    stop_on_signals(stop)
    if alongside is not None:
        threading.Thread(target=alongside, args=(stop,), name=f"{name}-alongside",
                         daemon=True).start()  # fmt: skip
    try:
        run_actuator(settings, group, sink, stop=stop, idle_exit_s=idle_exit_s,
                     readiness=readiness, stats=edge_stats)  # fmt: skip
    finally:
        stop.set()
        producer.close()
    return edge_stats


def summary(stats: ActuatorStats, edge_stats: EdgeStats, cluster: str) -> str:
    """The line an actuator prints when it stops."""
    return (f"actuator: {edge_stats.records} records, {stats.actions} actions for {cluster}: "
            f"{counts(stats.outcomes)}; {stats.dry_run} dry run, {stats.replayed} replayed; "
            f"refused: {counts(stats.refusals)}")  # fmt: skip


def counts(outcomes: dict[str, Any]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(outcomes.items())) or "none"
