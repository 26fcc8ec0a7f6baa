"""pipeline/kube/nodes.py: what a Node object says, without an API server."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from pipeline.kube import nodes

HOLD, MAINT = "fleetpulse.io/hold", "fleetpulse.io/maintenance"


def node(*, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         unschedulable: bool = False, ready: str | None = "True",
         capacity: dict[str, str] | None = None) -> Any:  # fmt: skip
    conditions = [client.V1NodeCondition(type="Ready", status=ready)] if ready else None
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="n1", labels=labels, annotations=annotations),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
        status=client.V1NodeStatus(conditions=conditions, capacity=capacity),
    )


def test_pool_zone_accelerator_and_capacity_from_labels() -> None:
    gke = node(labels={"cloud.google.com/gke-nodepool": "a3", "topology.kubernetes.io/zone": "z",
                       "cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"},
               capacity={"nvidia.com/gpu": "8"})  # fmt: skip
    record = nodes.inventory(gke, "c1", 1_764_000_000_000)
    assert (record.pool, record.zone, record.accelerator, record.capacity) == (
        "a3", "z", "nvidia-h100-mega-80gb", 8)
    eks = node(labels={"eks.amazonaws.com/nodegroup": "p5", "mine/pool": "own"})
    assert nodes.place(eks).pool == "p5"
    assert nodes.place(eks, "mine/pool").pool == "own"  # the configured label wins
    bare = node(capacity={"google.com/tpu": "4"})
    assert (nodes.place(bare).pool, nodes.accelerator(bare), nodes.capacity(bare)) == (
        "unknown", "none", 4)
    assert nodes.place(node(labels={"cloud.google.com/gke-nodepool": "/etc"})).pool == "unknown"


def test_who_holds_a_node() -> None:
    assert nodes.held_by_person(node(), HOLD, MAINT) is None
    assert "person" in (nodes.held_by_person(node(unschedulable=True), HOLD, MAINT) or "")
    ours = node(unschedulable=True, annotations={nodes.CORDONED_BY: "act-1"})
    assert nodes.held_by_person(ours, HOLD, MAINT) is None
    assert nodes.cordoned_by_us(ours) == "act-1"
    assert nodes.held_by_person(node(annotations={HOLD: ""}), HOLD, MAINT)
    assert nodes.held_by_person(node(labels={MAINT: "x"}), HOLD, MAINT)


def test_changes_people_make() -> None:
    def kinds(old: Any, new: Any) -> list[str]:
        return [kind for kind, _, _ in nodes.changes(old, new, HOLD, MAINT)]

    assert kinds(None, node()) == ["created"]
    assert kinds(node(), node(unschedulable=True)) == ["cordoned"]
    ours = node(unschedulable=True, annotations={nodes.CORDONED_BY: "a"})
    assert kinds(node(), ours) == []  # our own cordon: the actuator echoes it
    assert kinds(ours, node()) == []  # our own uncordon
    assert kinds(ours, node(annotations={nodes.CORDONED_BY: "a"})) == ["uncordoned"]  # a person
    assert kinds(node(), node(ready="False")) == ["not_ready"]
    assert kinds(node(ready="Unknown"), node()) == ["ready"]
    assert kinds(node(ready=None), node()) == []  # the kubelet's first report is no change
    assert kinds(node(), node(labels={MAINT: "fw"})) == ["held"]
    assert kinds(node(labels={MAINT: "fw"}), node()) == ["uncordoned"]
    asked = node(labels={nodes.REPAIR_LABEL: "reboot"}, annotations={nodes.REPAIR_ACTION_ID: "a9"})
    assert nodes.changes(asked, node(), HOLD, MAINT) == [
        ("repaired", "a9", "reboot done (the repair controller removed the label)")]


def test_the_applied_record_is_bounded_and_survives_bad_json() -> None:
    n = node()
    for i in range(nodes.ACTIONS_KEPT + 5):
        n = node(annotations={nodes.ACTIONS: nodes.with_applied(n, f"act-{i}", "cordoned")})
    done = nodes.applied(n)
    assert len(done) == nodes.ACTIONS_KEPT and f"act-{nodes.ACTIONS_KEPT + 4}" in done
    assert nodes.applied(node(annotations={nodes.ACTIONS: "{not json"})) == {}
    assert nodes.label_value("ecc/dbe volatile!") == "ecc_dbe_volatile"
