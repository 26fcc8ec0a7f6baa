"""The Kafka side of the Kubernetes actuator and watcher: the shared one
(pipeline/actuate/kafka.py), under the names the Kubernetes commands and tests import."""

from __future__ import annotations

from pipeline.actuate.kafka import STALLED_AFTER_S, ActuatorSink, Out, Producer, run_actuator

__all__ = ["STALLED_AFTER_S", "ActuatorSink", "Out", "Producer", "run_actuator"]
