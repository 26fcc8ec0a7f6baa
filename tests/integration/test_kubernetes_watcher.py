"""The node watcher against a real kube-apiserver: list + watch turns what people and the
cloud do to nodes into node_event/2 records, and the nodes into inventory/1 records."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pipeline.config import KubernetesSettings
from pipeline.kube import nodes
from pipeline.kube.actuator import Actuator
from pipeline.kube.release import Releaser
from pipeline.kube.watcher import NodeWatcher, Out
from pipeline.model import Inventory, NodeEvent
from pipeline.wire.codec import decode
from tests.integration.test_kubernetes_actuator import CLUSTER, action
from tests.kube_fixture import Kube

SETTINGS = KubernetesSettings(watch_timeout_s=5, pool_label="example.com/pool")


class Collected:
    def __init__(self) -> None:
        self.outs: list[Out] = []
        self.lock = threading.Lock()

    def __call__(self, outs: list[Out]) -> None:
        with self.lock:
            self.outs += outs

    def events(self, node: str) -> list[NodeEvent]:
        with self.lock:
            found = [decode(o.value, NodeEvent) for o in self.outs
                     if o.topic == "events.node" and o.value is not None]  # fmt: skip
        return [e for e in found if e.target == node]

    def inventory(self, node: str) -> list[Inventory | None]:
        with self.lock:
            return [None if o.value is None else decode(o.value, Inventory) for o in self.outs
                    if o.topic == "inventory" and o.key == f"{CLUSTER}/{node}"]  # fmt: skip

    def keys(self, topic: str, value: bytes | None = None) -> list[str]:
        with self.lock:
            return [o.key for o in self.outs if o.topic == topic and o.value == value]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def watching(kube: Kube) -> Iterator[Collected]:
    collected, stop = Collected(), threading.Event()
    watcher = NodeWatcher(kube.core, SETTINGS, CLUSTER, collected)
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: watcher.stats.lists == 1, "the first list")
    yield collected
    stop.set()
    thread.join(timeout=SETTINGS.watch_timeout_s + 10)
    assert not thread.is_alive()


def test_the_first_list_sends_every_node_as_inventory(kube: Kube) -> None:
    gpu = kube.node("gpu", labels={
        "cloud.google.com/gke-nodepool": "a3-mega", "topology.kubernetes.io/zone": "us-c1-a",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, gpus=8)  # fmt: skip
    tpu = kube.node("tpu", labels={
        "eks.amazonaws.com/nodegroup": "ignored-when-configured", "example.com/pool": "v5p",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x1"})  # fmt: skip
    collected = Collected()
    watcher = NodeWatcher(kube.core, SETTINGS, CLUSTER, collected)
    watcher.relist(first=True)
    (record,) = collected.inventory(gpu)
    assert record is not None
    assert (record.pool, record.zone, record.accelerator, record.capacity, record.source) == (
        "a3-mega", "us-c1-a", "NVIDIA-H100-80GB-HBM3", 8, "kubernetes")
    (record,) = collected.inventory(tpu)
    assert record is not None
    assert (record.pool, record.zone, record.accelerator) == ("v5p", "unknown", "tpu-v5p-slice")
    assert record.labels == {"tpu_topology": "2x2x1"}
    assert collected.events(gpu) == []  # the first list takes stock; it reports no changes


def test_a_human_cordon_and_uncordon_become_events_without_action_id(
    kube: Kube, watching: Collected
) -> None:
    name = kube.node()
    wait_for(lambda: watching.events(name), "the created event")
    kube.core.patch_node(name, {"spec": {"unschedulable": True}},
                         _content_type="application/merge-patch+json")
    cordoned = wait_for(lambda: [e for e in watching.events(name) if e.kind == "cordoned"],
                        "the cordon event")  # fmt: skip
    assert cordoned[0].action_id is None and "person" in cordoned[0].reason
    kube.core.patch_node(name, {"spec": {"unschedulable": False}},
                         _content_type="application/merge-patch+json")
    wait_for(lambda: [e for e in watching.events(name) if e.kind == "uncordoned"],
             "the uncordon event")


def test_our_own_cordon_is_left_to_the_actuators_echo(kube: Kube, watching: Collected) -> None:
    name = kube.node()
    wait_for(lambda: watching.events(name), "the created event")
    runner = Actuator(kube.core, KubernetesSettings(), CLUSTER)
    runner.handle(action(name, "cordon"))
    runner.handle(action(name, "uncordon"))
    marker = kube.node()  # watch events arrive in order: once this one is seen, so were those
    wait_for(lambda: watching.events(marker), "the marker node")
    assert [e.kind for e in watching.events(name)] == ["created"]


def test_node_deletion_sends_the_event_and_tombstones(kube: Kube, watching: Collected) -> None:
    name = kube.node(labels={"topology.kubernetes.io/zone": "z-b"})
    wait_for(lambda: watching.events(name), "the created event")
    kube.core.delete_node(name)
    deleted = wait_for(lambda: [e for e in watching.events(name) if e.kind == "deleted"],
                       "the deleted event")  # fmt: skip
    assert deleted[0].zone == "z-b"
    assert f"{CLUSTER}/{name}" in watching.keys("inventory")  # value None: a tombstone
    assert f"{CLUSTER}/{name}" in watching.keys("node-state")


def test_maintenance_ready_and_finished_repairs(kube: Kube, watching: Collected) -> None:
    name = kube.node()
    wait_for(lambda: watching.events(name), "the created event")
    kube.core.patch_node(name, {"metadata": {"labels": {SETTINGS.maintenance_label: "fw"}}},
                         _content_type="application/merge-patch+json")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "t",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
        _content_type="application/strategic-merge-patch+json")  # fmt: skip
    repair_id = f"act-{uuid.uuid4().hex[:16]}"
    kube.core.patch_node(name, {"metadata": {
        "labels": {"fleetpulse.io/repair": "reboot"},
        "annotations": {"fleetpulse.io/repair-action-id": repair_id}}},
        _content_type="application/merge-patch+json")  # fmt: skip
    kube.core.patch_node(name, {"metadata": {"labels": {"fleetpulse.io/repair": None}}},
                         _content_type="application/merge-patch+json")
    kinds = wait_for(lambda: [e.kind for e in watching.events(name)]
                     if len(watching.events(name)) >= 4 else None, "four events")  # fmt: skip
    assert kinds == ["created", "held", "not_ready", "repaired"]
    repaired = watching.events(name)[-1]
    assert repaired.action_id == repair_id


def test_a_relist_reports_what_changed_while_not_watching(kube: Kube) -> None:
    """After 410 Gone the watcher lists again and diffs: what happened meanwhile is sent."""
    kept, leaving = kube.node(), kube.node()
    collected = Collected()
    watcher = NodeWatcher(kube.core, SETTINGS, CLUSTER, collected)
    watcher.relist(first=True)
    kube.core.patch_node(kept, {"spec": {"unschedulable": True}},
                         _content_type="application/merge-patch+json")
    kube.core.delete_node(leaving)
    arrived = kube.node()
    watcher.relist(first=False)
    assert [e.kind for e in collected.events(kept)] == ["cordoned"]
    assert [e.kind for e in collected.events(leaving)] == ["deleted"]
    assert [e.kind for e in collected.events(arrived)] == ["created"]
    assert collected.inventory(leaving)[-1] is None


def test_a_release_is_not_taken_for_a_finished_repair(kube: Kube, watching: Collected) -> None:
    name = kube.node()
    wait_for(lambda: watching.events(name), "the created event")
    runner = Actuator(kube.core, KubernetesSettings(), CLUSTER)
    for kind in ("cordon", "drain", "reboot"):
        runner.handle(action(name, kind))
    kube.core.patch_node(name, {"spec": {"unschedulable": False}},
                         _content_type="application/merge-patch+json")  # a person's uncordon
    Releaser(kube.core, KubernetesSettings()).consider(kube.core.read_node(name))
    assert nodes.REPAIR_LABEL not in (kube.core.read_node(name).metadata.labels or {})
    marker = kube.node()  # watch events arrive in order: once this one is seen, so were those
    wait_for(lambda: watching.events(marker), "the marker node")
    assert [e.kind for e in watching.events(name)] == ["created", "uncordoned"]
