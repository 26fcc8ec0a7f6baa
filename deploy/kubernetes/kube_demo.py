"""The cluster side of `make kube-demo` (deploy/kubernetes/kube-demo.sh), on the development
API server: Node objects from the simulator's inventory with pods on them, waits, and what
happened, printed step by step. Only the API server runs there: evicted pods stay Terminating
(no kubelet), which is what the actuator's drain waits for.

    python deploy/kubernetes/kube_demo.py nodes INVENTORY.jsonl
    python deploy/kubernetes/kube_demo.py ready LOG...
    python deploy/kubernetes/kube_demo.py follow NODE --until repair|released --timeout S
    python deploy/kubernetes/kube_demo.py events
    python deploy/kubernetes/kube_demo.py cleanup INVENTORY.jsonl

The kubeconfig is $FLEETPULSE_KUBERNETES__KUBECONFIG; Kafka is $FLEETPULSE_KAFKA__BOOTSTRAP
with the topic prefix $FLEETPULSE_KAFKA__TOPIC_PREFIX.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

NAMESPACE = "kube-demo"
POOL_LABEL = "cloud.google.com/gke-nodepool"
ZONE_LABEL = "topology.kubernetes.io/zone"


def core() -> Any:
    from kubernetes import client, config

    config.load_kube_config(config_file=os.environ["FLEETPULSE_KUBERNETES__KUBECONFIG"])
    return client.CoreV1Api()


def inventory(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "node"]


def nodes(path: Path) -> None:
    """A Node object per node of the inventory (labelled as GKE labels GPU nodes, Ready) and
    two pods on each."""
    from kubernetes import client

    api = core()
    cleanup(path, quiet=True)
    if not api.list_namespace(field_selector=f"metadata.name={NAMESPACE}").items:
        api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        api.create_namespaced_service_account(NAMESPACE, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name="default")))  # fmt: skip
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for row in inventory(path):
        labels = {POOL_LABEL: row["pool"], ZONE_LABEL: row["zone"],
                  "nvidia.com/gpu.product": row.get("accelerator") or "gpu"}  # fmt: skip
        meta = client.V1ObjectMeta(name=row["name"], labels=labels)
        api.create_node(client.V1Node(metadata=meta))
        api.patch_node_status(row["name"], {"status": {
            "capacity": {"nvidia.com/gpu": str(row.get("capacity") or 8)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kube-demo", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}},
            _content_type="application/strategic-merge-patch+json")  # fmt: skip
        # the node lifecycle controller's part once a node is Ready: its not-ready taint
        # (which admission put on the new node) is taken off
        api.patch_node(row["name"], {"spec": {"taints": None}},
                       _content_type="application/merge-patch+json")  # fmt: skip
        for i in range(2):
            _pod(api, row["name"], f"train-{row['name'].removeprefix('fp-')}-{i}")
        print(f"  node {row['name']}  pool {row['pool']}  zone {row['zone']}  2 pods")


def _pod(api: Any, node: str, name: str) -> None:
    from kubernetes import client

    container = client.V1Container(name="c", image="trainer")
    api.create_namespaced_pod(NAMESPACE, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "train"}),
        spec=client.V1PodSpec(node_name=node, containers=[container])))  # fmt: skip
    running = {"status": {"phase": "Running"}}
    api.patch_namespaced_pod_status(name, NAMESPACE, running,
                                    _content_type="application/strategic-merge-patch+json")


def cleanup(path: Path, quiet: bool = False) -> None:
    from kubernetes.client.exceptions import ApiException

    api = core()
    for row in inventory(path):
        try:
            api.delete_node(row["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise
    for pod in api.list_namespaced_pod(NAMESPACE).items:
        api.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
    if not quiet:
        _delete_topics()
        print("  the demo's nodes, pods and topics deleted")


def _delete_topics() -> None:
    from kafka.admin import KafkaAdminClient

    prefix = os.environ["FLEETPULSE_KAFKA__TOPIC_PREFIX"]
    admin = KafkaAdminClient(bootstrap_servers=os.environ["FLEETPULSE_KAFKA__BOOTSTRAP"])
    try:
        mine = [t for t in admin.list_topics() if t.startswith(prefix)]
        if mine:
            admin.delete_topics(mine, timeout_ms=30_000)
    finally:
        admin.close()


def ready(logs: list[Path], timeout: float = 120) -> None:
    """Until each process's /readyz answers 200 (the port it announced in its log)."""
    deadline = time.monotonic() + timeout
    for log in logs:
        while not _ready(log):
            if time.monotonic() > deadline:
                sys.exit(f"kube-demo: {log.stem} not ready in {timeout:.0f} s; see {log}")
            time.sleep(0.5)
        print(f"  {log.stem}: ready")


def _ready(log: Path) -> bool:
    text = log.read_text(errors="replace") if log.exists() else ""
    found = re.search(r"(?:/readyz on |metrics=)http://[^:]+:(\d+)", text)
    if not found:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{found[1]}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def follow(name: str, until: str, timeout: float) -> None:
    """Print each change of the node (and its pods) until `until` happens."""
    api, shown, deadline = core(), "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = api.read_node(name)
        pods = api.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={name}").items
        now = describe(node, pods)
        if now != shown:
            print(f"  {time.strftime('%H:%M:%S')}  {name}\n{now}", flush=True)
            shown = now
        labels = node.metadata.labels or {}
        if until == "repair" and "fleetpulse.io/repair" in labels:
            return
        ours = [t for t in node.spec.taints or [] if t.key.startswith("fleetpulse.io/")]
        if until == "released" and not node.spec.unschedulable and not ours:
            return
        time.sleep(0.2)
    sys.exit(f"kube-demo: {name}: no {until} in {timeout:.0f} s")


def describe(node: Any, pods: list[Any]) -> str:
    conditions = {c.type: c for c in node.status.conditions or []}
    unhealthy = conditions.get("FleetPulseUnhealthy")
    taints = [f"{t.key}={t.value}:{t.effect}" for t in node.spec.taints or []]
    repair = (node.metadata.labels or {}).get("fleetpulse.io/repair")
    condition = f"{unhealthy.status} ({unhealthy.reason}: {unhealthy.message})" if unhealthy else ""
    states = [f"{p.metadata.name} " + ("Terminating (evicted)" if p.metadata.deletion_timestamp
                                        else "Running") for p in pods]  # fmt: skip
    lines = [
        f"      schedulable: {'no (cordoned)' if node.spec.unschedulable else 'yes'}",
        f"      taints: {', '.join(taints) or 'none'}",
        f"      condition FleetPulseUnhealthy: {condition or 'none'}",
        f"      repair label: {repair or 'none'}",
        f"      pods: {', '.join(states) or 'none'}",
    ]
    return "\n".join(lines)


def events() -> None:
    """fleet.actions and fleet.events.node, in order."""
    from kafka import KafkaConsumer

    prefix = os.environ["FLEETPULSE_KAFKA__TOPIC_PREFIX"]
    rows = []
    for topic in ("actions", "events.node"):
        bootstrap = os.environ["FLEETPULSE_KAFKA__BOOTSTRAP"]
        consumer = KafkaConsumer(f"{prefix}.{topic}", bootstrap_servers=bootstrap,
                                 auto_offset_reset="earliest", consumer_timeout_ms=2000)
        rows += [(r.timestamp, topic, json.loads(r.value)) for r in consumer]
        consumer.close()
    for stamp, topic, value in sorted(rows, key=lambda r: r[0]):
        when = time.strftime("%H:%M:%S", time.localtime(stamp / 1000))
        if topic == "actions":
            target = value["target"].get("name") or value["target"].get("node")
            why = ", ".join(value["reason"]["checks"]) or value["reason"]["summary"]
            print(f"  {when}  fleet.actions      {value['kind']:9} {target}  ({why})")
        else:
            print(f"  {when}  fleet.events.node  {value['kind']:9} {value['target']}  "
                  f"by {value['actor']}: {value.get('reason', '')}"[:160])  # fmt: skip


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("nodes").add_argument("inventory", type=Path)
    sub.add_parser("cleanup").add_argument("inventory", type=Path)
    sub.add_parser("ready").add_argument("logs", type=Path, nargs="+")
    follows = sub.add_parser("follow")
    follows.add_argument("node")
    follows.add_argument("--until", choices=("repair", "released"), required=True)
    follows.add_argument("--timeout", type=float, default=120)
    sub.add_parser("events")
    args = parser.parse_args()
    if args.command == "nodes":
        nodes(args.inventory)
    elif args.command == "cleanup":
        cleanup(args.inventory)
    elif args.command == "ready":
        ready(args.logs)
    elif args.command == "follow":
        follow(args.node, args.until, args.timeout)
    else:
        events()


if __name__ == "__main__":
    main()
