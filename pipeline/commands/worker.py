"""`fleetpulse worker`: the Kafka runtime (the faust app in streams/), until SIGTERM."""

from __future__ import annotations

import argparse
import sys

from pipeline.config import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run the stream processors on Kafka (detect, health, policy)",
        description="Consume the telemetry and event topics, run the detectors, the health "
        "machine and the policy with their state in faust tables (changelog-backed), and "
        "produce findings, utilization, proposals, node states, actions, alerts and dead "
        "letters. Start as many workers as partitions allow: they share the work as one "
        "consumer group and take over each other's partitions. Stops cleanly on SIGTERM.",
        epilog="Settings: [kafka] bootstrap/topic_prefix/partitions, [worker] group_id/store/"
        "standby_replicas/session_timeout_s, [metrics] host/port (default 0.0.0.0:9108, "
        "0 = any free port; /metrics, /healthz, /readyz). The topics "
        "must exist: `fleetpulse topics create`.",
    )
    parser.add_argument(
        "--loglevel",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log level of the worker and of faust (default: warning)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.inventory.enforce:
        print(
            "fleetpulse worker: no inventory enforced ([inventory] enforce = false): pools, zones "
            "and budgets come from telemetry; see `fleetpulse inventory load`",
            file=sys.stderr,
            flush=True,
        )
    from streams.worker import run  # faust only when a worker runs; pipeline/ never imports it

    return run(settings, loglevel=args.loglevel)
