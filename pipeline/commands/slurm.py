"""`fleetpulse actuate slurm` and `fleetpulse watch slurm`: close the loop on a Slurm cluster.

    fleetpulse actuate slurm          # fleet.actions → scontrol; outcomes → fleet.events.node
    fleetpulse watch slurm            # sinfo --json → fleet.events.node and fleet.inventory

Both run Slurm's own commands with [slurm] (slurm.conf, timeouts) and serve /metrics,
/healthz and /readyz. See docs/slurm.md for what each action does to a node, the reason
convention, and the permissions they need.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from pipeline.config import Settings
from pipeline.selfmetrics import serve_stats
from pipeline.wire.edge import stop_on_signals


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `slurm` under the `actuate` and `watch` commands (pipeline/commands/kube.py makes
    them; it is registered first)."""
    actuate = _targets(subparsers, "actuate").add_parser(
        "slurm",
        help="drain, resume its own drains, reboot ASAP on Slurm nodes (scontrol)",
        description="Consume fleet.actions for slurm.cluster (consumer group slurm.group_id, "
        "default fleetpulse-actuator-<cluster>) and carry each action out once through "
        "scontrol: cordon = State=DRAIN with reason 'fleetpulse: <check> <action_id>' (running "
        "jobs finish), drain = the same and waiting until DRAINED (else blocked, naming the "
        "jobs), reboot/reset_gpu/repair = reboot ASAP nextstate=RESUME, uncordon = RESUME of "
        "FleetPulse's own drains only. A node a person drained or in a maintenance reservation "
        "is held, untouched. Every outcome is echoed on fleet.events.node. The defences and "
        "removal caps are the Kubernetes actuator's (slurm.max_*). dry_run actions are logged "
        "only. SIGTERM stops it; actions not finished are carried out again on restart.",
    )
    actuate.add_argument("--idle-exit", type=float, metavar="SECONDS",
                         help="exit after SECONDS without an action (default: run until stopped)")
    actuate.set_defaults(handler=_actuate)
    watch = _targets(subparsers, "watch").add_parser(
        "slurm",
        help="poll Slurm's nodes (sinfo --json)",
        description="Poll `sinfo --json` every slurm.poll_s: every node an inventory/1 record "
        "on fleet.inventory (pool from its partition or a feature, accelerator and count from "
        "GRES); people's drains and resumes (reason, user, time), DOWN / not responding, "
        "maintenance reservations, reboots done, nodes added or removed become node_event/2 "
        "records on fleet.events.node. A failed poll changes nothing (never read as 'no "
        "drains'). SIGTERM stops it.",
    )
    watch.set_defaults(handler=_watch)


def _targets(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             command: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:  # fmt: skip
    parser = subparsers.choices[command]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError(f"`{command}` has no targets: register pipeline.commands.kube first")


def _cluster(settings: Settings) -> str:
    return settings.slurm.cluster or settings.sources.cluster


def _actuate(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.actuate.base import ActuatorStats
    from pipeline.actuate.process import run_actuator_process, summary
    from pipeline.slurm.actuator import SlurmActuator
    from pipeline.slurm.commands import Slurm

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cluster = _cluster(settings)

    def make(stats: Any) -> SlurmActuator:
        return SlurmActuator(Slurm(settings.slurm), settings.slurm, cluster, stats=stats)

    stats = ActuatorStats()
    edge_stats = run_actuator_process(
        settings, name="slurm", client="slurm-actuator", stats=stats, make=make,
        idle_exit_s=args.idle_exit,
        group=settings.slurm.group_id or f"fleetpulse-actuator-{cluster}")  # fmt: skip
    print(summary(stats, edge_stats, cluster))
    return 0


def _watch(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.actuate.kafka import Producer
    from pipeline.slurm.commands import Slurm
    from pipeline.slurm.watcher import SlurmWatcher, SlurmWatcherStats

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stats = SlurmWatcherStats()
    producer = Producer(settings, f"{settings.kafka.client_id}-slurm-watcher")
    watcher = SlurmWatcher(Slurm(settings.slurm), settings.slurm, _cluster(settings),
                           producer.send, stats=stats)  # fmt: skip
    serve_stats("watch_slurm", stats, settings.metrics, watcher.readiness)
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        watcher.run(stop)
    finally:
        producer.close()
    print(f"watcher: {stats.nodes} nodes, {stats.polls} polls ({stats.poll_errors} failed), "
          f"{stats.node_events} node events, {stats.inventory_records} inventory records")
    return 0

