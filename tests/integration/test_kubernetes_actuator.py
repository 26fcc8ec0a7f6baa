"""The reference Kubernetes actuator against a real kube-apiserver (deploy/kubernetes/kube.sh):
what each action does to the node objects, and the outcome it echoes for fleet.events.node."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from pipeline.config import KubernetesSettings
from pipeline.errors import SinkError
from pipeline.kube import nodes
from pipeline.kube.actuator import Actuator
from pipeline.model import Action, NodeEvent, Reason, Target
from tests.kube_fixture import Kube

CLUSTER = "kube-test"
SETTINGS = KubernetesSettings(drain_timeout_s=2.0, eviction_backoff_initial_s=0.1,
                              eviction_backoff_max_s=0.3)  # fmt: skip


def action(node: str, kind: str = "cordon", **extra: Any) -> Action:
    fields: dict[str, Any] = {
        "action_id": f"act-{uuid.uuid4().hex[:16]}",
        "ts": int(time.time() * 1000),
        "kind": kind,
        "target": Target(cluster=CLUSTER, kind="node", name=node, pool="a3", zone="z-a"),
        "reason": Reason(checks=["xid.79"], finding_ids=[], summary="GPU fell off the bus"),
        "dry_run": False,
        "proposal_id": f"prp-{uuid.uuid4().hex[:16]}",
        "expires_at": int(time.time() * 1000) + 900_000,  # the actuator refuses an action without
    }
    return Action(**(fields | extra))


def tpu_labels(slice_name: str) -> dict[str, str]:
    """A TPU slice host's labels on GKE: the slice is its node pool."""
    return {SETTINGS.slice_label: slice_name, "topology.kubernetes.io/zone": "z-a",
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
            "cloud.google.com/gke-tpu-topology": "2x2x2"}  # fmt: skip


def slice_action(slice_name: str, kind: str, **extra: Any) -> Action:
    target = Target(cluster=CLUSTER, kind="slice", name=slice_name, pool=slice_name, zone="z-a")
    return action("x", kind, target=target, **extra)


def actuator(kube: Kube, settings: KubernetesSettings = SETTINGS) -> Actuator:
    return Actuator(kube.core, settings, CLUSTER)


def test_cordon_sets_unschedulable_taint_condition_and_annotation(kube: Kube) -> None:
    name = kube.node()
    act = action(name)
    echo = actuator(kube).handle(act)
    node = kube.core.read_node(name)
    assert node.spec.unschedulable is True
    taints = {(t.key, t.value, t.effect) for t in node.spec.taints}
    assert (nodes.TAINT_KEY, "xid.79", "NoSchedule") in taints
    # the taint admission put on the new node stays: ours is added, nothing replaced
    assert ("node.kubernetes.io/not-ready", None, "NoSchedule") in taints
    assert node.metadata.annotations[nodes.CORDONED_BY] == act.action_id
    condition = {c.type: c for c in node.status.conditions}[nodes.CONDITION]
    assert condition.status == "True" and act.action_id in condition.message
    assert "Ready" in {c.type for c in node.status.conditions}  # merged, not replaced
    assert isinstance(echo, NodeEvent)
    assert (echo.kind, echo.action_id, echo.target) == ("cordoned", act.action_id, name)


def test_drain_evicts_bound_pods_but_not_daemonset_or_mirror_pods(kube: Kube) -> None:
    name = kube.node()
    plain = [kube.pod(name), kube.pod(name, labels={"app": "web"})]
    daemon, mirror = kube.pod(name, owner="DaemonSet"), kube.pod(name, mirror=True)
    act = action(name, "drain")
    echo = actuator(kube).handle(act)
    pods = kube.pods_on(name)
    assert all(pods[p].metadata.deletion_timestamp is not None for p in plain)  # evicted
    assert pods[daemon].metadata.deletion_timestamp is None
    assert pods[mirror].metadata.deletion_timestamp is None
    assert echo is not None and echo.kind == "drained", echo
    node = kube.core.read_node(name)
    assert node.spec.unschedulable is True  # a drain leaves the node cordoned (by us)
    assert node.metadata.annotations[nodes.CORDONED_BY] == act.action_id


def test_a_pdb_that_refuses_blocks_the_drain_and_the_block_is_reported(kube: Kube) -> None:
    name, app = kube.node(), f"db-{uuid.uuid4().hex[:6]}"
    guarded = kube.pod(name, labels={"app": app})
    budget = kube.pdb({"app": app}, allowed=0)
    act = action(name, "drain")
    runner = actuator(kube)
    echo = runner.handle(act)
    assert echo is not None and echo.kind == "blocked", echo
    assert guarded in echo.reason and "PodDisruptionBudget" in echo.reason
    assert kube.pods_on(name)[guarded].metadata.deletion_timestamp is None
    assert runner.stats.eviction_refusals >= 2  # retried with backoff before giving up
    # the controller's status allows one disruption: a new drain goes through
    kube.pdb_allows(budget, 1)
    echo = runner.handle(action(name, "drain"))
    assert echo is not None and echo.kind == "drained", echo
    assert kube.pods_on(name)[guarded].metadata.deletion_timestamp is not None


def test_a_persons_cordon_is_never_undone(kube: Kube) -> None:
    name = kube.node(unschedulable=True)
    before = kube.core.read_node(name)
    runner = actuator(kube)
    for kind in ("uncordon", "cordon", "drain", "reboot"):
        echo = runner.handle(action(name, kind))
        assert echo is not None and echo.kind == "held", (kind, echo)
        assert echo.action_id is not None and "person" in echo.reason
    after = kube.core.read_node(name)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.spec.unschedulable is True


def test_a_node_annotated_as_held_is_reported_not_touched(kube: Kube) -> None:
    name = kube.node(annotations={SETTINGS.held_annotation: "oncall: bad NIC"})
    before = kube.core.read_node(name).metadata.resource_version
    echo = actuator(kube).handle(action(name, "cordon"))
    assert echo is not None and echo.kind == "held"
    assert kube.core.read_node(name).metadata.resource_version == before


def test_uncordon_releases_only_our_own_cordon(kube: Kube) -> None:
    name = kube.node()
    runner = actuator(kube)
    runner.handle(action(name, "cordon"))
    echo = runner.handle(action(name, "uncordon"))
    assert echo is not None and echo.kind == "uncordoned"
    node = kube.core.read_node(name)
    assert not node.spec.unschedulable
    assert [t.key for t in node.spec.taints or []] == ["node.kubernetes.io/not-ready"]
    assert nodes.CORDONED_BY not in (node.metadata.annotations or {})
    assert {c.type: c.status for c in node.status.conditions}[nodes.CONDITION] == "False"


def test_a_replayed_action_changes_nothing(kube: Kube) -> None:
    name = kube.node()
    runner = actuator(kube)
    act = action(name, "cordon")
    first = runner.handle(act)
    version = kube.core.read_node(name).metadata.resource_version
    again = runner.handle(act)
    assert kube.core.read_node(name).metadata.resource_version == version
    assert first is not None and again is not None
    assert (again.kind, again.action_id) == (first.kind, first.action_id)  # echoed again
    assert runner.stats.replayed == 1
    recorded = json.loads(kube.core.read_node(name).metadata.annotations[nodes.ACTIONS])
    assert recorded == {act.action_id: "cordoned"}


class _StatusRefusedOnce:
    """The real client, except that the first status patch fails as a server error would."""

    def __init__(self, core: Any) -> None:
        self._core, self.refused = core, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def patch_node_status(self, *args: Any, **kwargs: Any) -> Any:
        if not self.refused:
            self.refused = True
            raise ApiException(status=500, reason="etcd timeout")
        return self._core.patch_node_status(*args, **kwargs)


def test_a_cordon_whose_condition_failed_is_finished_when_redelivered(kube: Kube) -> None:
    name = kube.node()
    core = _StatusRefusedOnce(kube.core)
    runner = Actuator(core, SETTINGS, CLUSTER)
    act = action(name, "cordon")
    with pytest.raises(SinkError, match="HTTP 500"):
        runner.handle(act)  # not committed: the edge delivers it again
    assert core.refused
    echo = runner.handle(act)
    assert echo is not None and echo.kind == "cordoned"
    node = kube.core.read_node(name)
    condition = {c.type: c for c in node.status.conditions}[nodes.CONDITION]
    assert condition.status == "True" and act.action_id in condition.message
    assert node.spec.unschedulable is True


def test_dry_run_changes_nothing_and_echoes_nothing(kube: Kube) -> None:
    name = kube.node()
    kube.pod(name)
    before = kube.core.read_node(name).metadata.resource_version
    runner = actuator(kube)
    for kind in ("cordon", "drain", "repair"):
        assert runner.handle(action(name, kind, dry_run=True)) is None
    assert kube.core.read_node(name).metadata.resource_version == before
    assert all(p.metadata.deletion_timestamp is None for p in kube.pods_on(name).values())


def test_a_stale_action_is_skipped_with_the_reason(kube: Kube) -> None:
    name = kube.node()
    before = kube.core.read_node(name).metadata.resource_version
    stale = action(name, "cordon", expires_at=int(time.time() * 1000) - 5_000)
    echo = actuator(kube).handle(stale)
    assert echo is not None and echo.kind == "skipped" and "expired" in echo.reason
    assert kube.core.read_node(name).metadata.resource_version == before


def test_a_repair_becomes_a_label_for_the_repair_controller(kube: Kube) -> None:
    name = kube.node()
    runner = actuator(kube)
    runner.handle(action(name, "cordon"))
    act = action(name, "reset_gpu", device="0,3")
    echo = runner.handle(act)
    assert echo is not None and echo.kind == "repair_requested"
    node = kube.core.read_node(name)
    assert node.metadata.labels[nodes.REPAIR_LABEL] == "reset_gpu"
    assert node.metadata.annotations[nodes.REPAIR_ACTION_ID] == act.action_id
    assert node.metadata.annotations[nodes.REPAIR_DEVICE] == "0,3"


def test_missing_node_and_other_clusters(kube: Kube) -> None:
    runner = actuator(kube)
    echo = runner.handle(action("no-such-node-x1", "cordon"))
    assert echo is not None and echo.kind == "refused" and "no node" in echo.reason
    assert runner.stats.refusals == {"not_found": 1}
    other = action("whatever", "cordon")
    other = Action(**{f: getattr(other, f) for f in other.__struct_fields__} | {
        "target": Target(cluster="elsewhere", kind="node", name="n1", pool="p", zone="z")})
    assert runner.handle(other) is None and runner.stats.other_cluster == 1


@pytest.mark.parametrize("kind", ["cordon", "drain"])
def test_a_slice_is_acted_on_node_by_node(kube: Kube, kind: str) -> None:
    slice_name = f"tpu-{uuid.uuid4().hex[:6]}"
    members = [kube.node(labels=tpu_labels(slice_name)) for _ in range(2)]
    act = slice_action(slice_name, kind)
    echo = actuator(kube).handle(act)
    assert echo is not None and echo.target_kind == "slice" and echo.kind in ("cordoned", "drained")
    assert all(kube.core.read_node(m).spec.unschedulable for m in members)


@pytest.mark.parametrize(("kind", "target_kind", "name"), [
    ("repair_switch", "switch", "leaf-07"), ("repair_link", "link", None)])  # fmt: skip
def test_a_network_element_is_left_to_the_network_teams_actuator(
    kube: Kube, kind: str, target_kind: str, name: str | None
) -> None:
    node = kube.node()
    element = name or f"{node}:mlx5_0:1"  # a link is named <node>:<hca>:<port>
    act = action("x", kind)
    act = Action(**{f: getattr(act, f) for f in act.__struct_fields__} | {
        "target": Target(cluster=CLUSTER, kind=target_kind, name=element, pool="p", zone="z")})
    runner = actuator(kube)
    assert runner.handle(act) is None  # node_event/2 names nodes and slices: nothing to echo
    assert runner.stats.network_elements == 1 and runner.stats.actions == 0
    assert not kube.core.read_node(node).spec.unschedulable  # the node stays in service
