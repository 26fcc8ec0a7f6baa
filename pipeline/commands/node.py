"""`fleetpulse node release NODE`: a person takes a node back from FleetPulse, on purpose.

    fleetpulse node release gpu-a3-017                     # the cluster of [kubernetes]
    fleetpulse node release gpu-a3-017 --cluster us-c1 --kubeconfig ~/.kube/us-c1

Clears every mark FleetPulse put on the node (its cordon, the fleetpulse.io/unhealthy
NoSchedule taint, the FleetPulseUnhealthy condition, set to False, the fleetpulse.io/repair
label and its annotations, the cordoned-by annotation) and echoes an `uncordoned` node event
without an action_id on fleet.events.node, so the health machine ends its episode as it does
for a person's uncordon. A cordon a person made stays: release only takes FleetPulse's own.
See docs/kubernetes.md.
"""

from __future__ import annotations

import argparse
import getpass
import time
from typing import Any

import msgspec

from pipeline.config import Settings
from pipeline.errors import FleetPulseError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    node = subparsers.add_parser(
        "node", help="a person's commands on one node (release it from FleetPulse)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    verbs = node.add_subparsers(dest="verb", metavar="VERB", required=True)
    release = verbs.add_parser(
        "release",
        help="clear FleetPulse's cordon, taint, condition and repair label on NODE",
        description="Release NODE from FleetPulse: uncordon it if FleetPulse cordoned it, "
        "remove the fleetpulse.io/unhealthy taint, set FleetPulseUnhealthy to False, remove "
        "the fleetpulse.io/repair label and FleetPulse's annotations; then echo `uncordoned` "
        "(a person's) on fleet.events.node. A person's own cordon stays.",
    )
    release.add_argument("name", metavar="NODE", help="the Kubernetes node name")
    release.add_argument("--cluster", help="FleetPulse cluster name of the node "
                         "(default: kubernetes.cluster, else sources.cluster)")  # fmt: skip
    release.add_argument("--kubeconfig", help="kubeconfig file (default: kubernetes.kubeconfig, "
                         "else $KUBECONFIG)")  # fmt: skip
    release.add_argument("--context", help="kubeconfig context (default: kubernetes.context)")
    release.add_argument("--reason", default="", help="why, for the node event")
    release.add_argument("--no-echo", action="store_true",
                         help="do not send the node event (no Kafka at hand)")
    release.set_defaults(handler=_release)


def _release(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kube import nodes
    from pipeline.kube.client import connect
    from pipeline.kube.release import release

    kube = settings.kubernetes
    changes = {k: v for k, v in (("kubeconfig", args.kubeconfig), ("context", args.context),
                                 ("cluster", args.cluster)) if v}  # fmt: skip
    if changes:
        kube = msgspec.structs.replace(kube, in_cluster=False if args.kubeconfig else
                                       kube.in_cluster, **changes)  # fmt: skip
    cluster = kube.cluster or settings.sources.cluster
    who = f"{getpass.getuser()} (fleetpulse node release)"
    apis = connect(kube)
    if not release(apis.core, args.name, kube, who=who, uncordon=True):
        raise FleetPulseError(f"node {args.name}: no such node in the cluster")
    node = apis.core.read_node(args.name, _request_timeout=kube.request_timeout_s)
    print(f"node {args.name}: released from FleetPulse (schedulable: "
          f"{not nodes.cordoned(node)})")  # fmt: skip
    if not args.no_echo:
        _echo(settings, cluster, node, who, args.reason)
    return 0


def _echo(settings: Settings, cluster: str, node: Any, who: str, why: str) -> None:
    from pipeline.kube import nodes
    from pipeline.kube.kafka import Producer
    from pipeline.kube.watcher import Out
    from pipeline.model import NodeEvent
    from pipeline.wire.codec import encode
    from pipeline.wire.topics import record_key

    where = nodes.place(node, settings.kubernetes.pool_label)
    event = NodeEvent(ts=int(time.time() * 1000), cluster=cluster, target_kind="node",
                      target=node.metadata.name, pool=where.pool, zone=where.zone,
                      kind="uncordoned", actor=who[:256],
                      reason=f"released from FleetPulse by a person: {why}"[:4096])  # fmt: skip
    producer = Producer(settings, f"{settings.kafka.client_id}-node-release")
    try:
        producer.send([Out("events.node", record_key(event), encode(event))])
    finally:
        producer.close()
    print(f"echoed on fleet.events.node: uncordoned ({cluster}/{event.target})")
