"""`fleetpulse actuate kubernetes` and `fleetpulse watch kubernetes`: close the loop.

    fleetpulse actuate kubernetes          # fleet.actions → nodes; outcomes → fleet.events.node
    fleetpulse watch kubernetes            # nodes → fleet.events.node and fleet.inventory

Both talk to the cluster named by [kubernetes] (kubeconfig, or in_cluster with the pod's
ServiceAccount) and serve /metrics, /healthz and /readyz. See docs/kubernetes.md for what
each action does to a node, the RBAC they need, and the marks a repair controller watches.
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
    actuate = subparsers.add_parser(
        "actuate", help="carry out fleet.actions (the reference Kubernetes actuator)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    targets = actuate.add_subparsers(dest="actuator", metavar="TARGET", required=True)
    kube = targets.add_parser(
        "kubernetes",
        help="cordon, drain (Eviction API), uncordon, request repairs on Kubernetes nodes",
        description="Consume fleet.actions for kubernetes.cluster (consumer group "
        "kubernetes.group_id, default fleetpulse-actuator-<cluster>), carry each action out "
        "once (idempotent by action_id, recorded on the node), never touch a node a person "
        "holds, and echo every outcome on fleet.events.node: cordoned, drained, uncordoned, "
        "repair_requested, or held / blocked / skipped / refused with the reason. It refuses "
        "actions without expires_at, too old, keyed or labelled unlike their target, or over "
        "its own removal caps (kubernetes.max_removals*), and repairs of nodes it has not "
        "drained. Drains run in parallel, one per node. A node a person uncordons is released "
        "of every FleetPulse mark. dry_run actions are logged only. SIGTERM stops it; actions "
        "not finished are carried out again on restart.",
    )
    kube.add_argument("--idle-exit", type=float, metavar="SECONDS",
                      help="exit after SECONDS without an action (default: run until stopped)")
    kube.set_defaults(handler=_actuate)

    watch = subparsers.add_parser(
        "watch", help="watch an orchestrator's nodes (fleet.events.node, fleet.inventory)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    wtargets = watch.add_subparsers(dest="watcher", metavar="TARGET", required=True)
    wkube = wtargets.add_parser(
        "kubernetes",
        help="list + watch Kubernetes nodes",
        description="List the cluster's nodes (each one an inventory/1 record on the compacted "
        "fleet.inventory: pool, zone, accelerator, capacity), then watch them from the list's "
        "resourceVersion, listing again on 410 Gone. Node created/deleted (tombstones on "
        "fleet.inventory and fleet.node-state), cordons and uncordons by people, the hold "
        "annotation, the maintenance label, Ready changes and finished repairs become "
        "node_event/2 records on fleet.events.node. SIGTERM stops it.",
    )
    wkube.set_defaults(handler=_watch)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    stop_on_signals(stop)
    return stop


def _cluster(settings: Settings) -> str:
    return settings.kubernetes.cluster or settings.sources.cluster


def _actuate(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.actuate.process import run_actuator_process, summary
    from pipeline.kube.actuator import Actuator, ActuatorStats
    from pipeline.kube.client import connect
    from pipeline.kube.release import Releaser, ReleaseStats

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cluster = _cluster(settings)
    stats, release_stats = ActuatorStats(), ReleaseStats()
    apis: Any = None

    def make(stats: Any) -> Actuator:
        nonlocal apis
        apis = connect(settings.kubernetes)
        return Actuator(apis.core, settings.kubernetes, cluster, stats=stats)

    def release(stop: threading.Event) -> None:  # people win: a person's uncordon frees the node
        Releaser(apis.core, settings.kubernetes, stats=release_stats).run(stop)

    edge_stats = run_actuator_process(
        settings, name="kubernetes", client="actuator", stats=stats, make=make,
        idle_exit_s=args.idle_exit,
        group=settings.kubernetes.group_id or f"fleetpulse-actuator-{cluster}",
        extra_stats=[release_stats], alongside=release)  # fmt: skip
    print(f"{summary(stats, edge_stats, cluster)}; {release_stats.releases} released by people")
    return 0


def _watch(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kube.client import connect
    from pipeline.kube.kafka import Producer
    from pipeline.kube.watcher import NodeWatcher, WatcherStats

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stats = WatcherStats()
    ready = {"listed": False}
    serve_stats("watch_kubernetes", stats, settings.metrics,
                lambda: (ready["listed"], "nodes listed" if ready["listed"] else "listing"))
    apis = connect(settings.kubernetes)
    producer = Producer(settings, f"{settings.kafka.client_id}-node-watcher")

    def emit(outs: Any) -> None:
        producer.send(outs)
        ready["listed"] = True

    watcher = NodeWatcher(apis.core, settings.kubernetes, _cluster(settings), emit, stats=stats)
    try:
        watcher.run(_stop_on_signals())
    finally:
        producer.close()
    print(f"watcher: {stats.nodes} nodes, {stats.node_events} node events, "
          f"{stats.inventory_records} inventory records, {stats.relists} re-lists")
    return 0

