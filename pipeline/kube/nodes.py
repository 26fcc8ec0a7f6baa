"""What a Node object says, for the actuator and the watcher; pure (no I/O, no clock).

FleetPulse's marks on a node, all under fleetpulse.io/:

- annotation `fleetpulse.io/cordoned-by: <action_id>`: FleetPulse cordoned it (with the taint
  `fleetpulse.io/unhealthy=<check>:NoSchedule` and the `FleetPulseUnhealthy` condition). Only
  such a cordon is ever released by FleetPulse; any other cordon is a person's.
- annotation `fleetpulse.io/actions`: JSON {action_id: outcome} of the last actions carried out
  on the node, so a redelivered action is recognised and changes nothing.
- label `fleetpulse.io/repair: <kind>` (reset_gpu, reboot, repair, replace, repair_slice) with
  annotations `fleetpulse.io/repair-action-id`, `-reason`, `-device`: a repair request for a
  repair controller to pick up; it removes the label when done (the watcher echoes
  `repaired`).
- annotation `fleetpulse.io/released: <time> by <who>`: a person released the node from
  FleetPulse (their uncordon, or `fleetpulse node release`); the marks above were cleared,
  and a removal decided before that time is not carried out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.model import Inventory

PREFIX = "fleetpulse.io/"
CORDONED_BY = PREFIX + "cordoned-by"
CORDON_REASON = PREFIX + "cordon-reason"
ACTIONS = PREFIX + "actions"
TAINT_KEY = PREFIX + "unhealthy"
CONDITION = "FleetPulseUnhealthy"
FIELD_MANAGER = "fleetpulse"  # the API server's name for our writes (managedFields)
REPAIR_LABEL = PREFIX + "repair"
REPAIR_ACTION_ID = PREFIX + "repair-action-id"
REPAIR_REASON = PREFIX + "repair-reason"
REPAIR_DEVICE = PREFIX + "repair-device"
RELEASED = PREFIX + "released"
ACTIONS_KEPT = 32  # action ids remembered per node: far more than one episode's actions

POOL_LABELS = ("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup")
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
ACCELERATOR_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "cloud.google.com/gke-tpu-accelerator",
)
# nvidia.com/gpu.shared: what the device plugin advertises for shared GPUs with renameByDefault
CAPACITY_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "google.com/tpu")
# GPU feature discovery (GFD) labels: the physical GPUs, and how each is shared. Under
# time-slicing or MPS the device plugin advertises `replicas` units per GPU, so
# status.capacity counts replicas, not GPUs; GFD also appends "-SHARED" to gpu.product.
GPU_COUNT, GPU_REPLICAS = "nvidia.com/gpu.count", "nvidia.com/gpu.replicas"
GPU_SHARING = "nvidia.com/gpu.sharing-strategy"
SHARED_SUFFIX = "-SHARED"
INVENTORY_LABELS = {  # node labels copied into the inventory record's labels, first one wins
    "cloud.google.com/gke-tpu-topology": "tpu_topology",
    "cloud.google.com/gke-accelerator": "gke_accelerator",
    "node.kubernetes.io/instance-type": "instance_type",
    "beta.kubernetes.io/instance-type": "instance_type",  # before Kubernetes 1.17
    "topology.kubernetes.io/region": "region",
    "failure-domain.beta.kubernetes.io/region": "region",  # before Kubernetes 1.17
    GPU_SHARING: "gpu_sharing",
    GPU_REPLICAS: "gpu_replicas",
}
UNKNOWN = "unknown"  # pool/zone/accelerator a node does not name (inventory needs a value)
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")


def node_labels(node: Any) -> dict[str, str]:
    return dict(node.metadata.labels or {})


def node_annotations(node: Any) -> dict[str, str]:
    return dict(node.metadata.annotations or {})


def label_value(text: str) -> str:
    """`text` as a valid label (or taint) value: [A-Za-z0-9_.-], at most 63, alphanumeric ends."""
    value = _LABEL_VALUE.sub("_", text)[:63].strip("_.-")
    return value or "unhealthy"


def cordoned(node: Any) -> bool:
    return bool(node.spec is not None and node.spec.unschedulable)


def cordoned_by_us(node: Any) -> str | None:
    """The action_id of FleetPulse's cordon on the node, or None (not cordoned by us).

    The annotation alone is not proof: a person may have uncordoned and cordoned again while
    no releaser ran. The API server records who last set spec.unschedulable (managedFields):
    when that is someone else (`kubectl cordon` is kubectl-cordon), the cordon is theirs."""
    ours = node_annotations(node).get(CORDONED_BY) if cordoned(node) else None
    if ours is None:
        return None
    managers = _managers_of_unschedulable(node)
    return ours if not managers or FIELD_MANAGER in managers else None


def _managers_of_unschedulable(node: Any) -> set[str]:
    entries = getattr(node.metadata, "managed_fields", None) or []
    return {
        str(entry.manager)
        for entry in entries
        if "f:unschedulable" in ((entry.fields_v1 or {}).get("f:spec") or {})
    }


def released_at(node: Any) -> int | None:
    """When a person last released the node from FleetPulse (epoch ms), or None."""
    value = node_annotations(node).get(RELEASED, "")
    try:
        stamp = datetime.strptime(value[:24], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(stamp.timestamp() * 1000)


def held_by_person(node: Any, held_annotation: str, maintenance_label: str) -> str | None:
    """Why a person holds the node (their cordon, a hold annotation, a maintenance label), or
    None. FleetPulse never acts on such a node."""
    if held_annotation and held_annotation in node_annotations(node):
        return f"annotated {held_annotation}"
    if maintenance_label and maintenance_label in node_labels(node):
        return f"labelled {maintenance_label}"
    if cordoned(node) and cordoned_by_us(node) is None:
        return "cordoned by a person"
    return None


def applied(node: Any) -> dict[str, str]:
    """{action_id: outcome} FleetPulse recorded on the node (bad JSON reads as empty)."""
    try:
        value = json.loads(node_annotations(node).get(ACTIONS, "{}"))
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def with_applied(node: Any, action_id: str, outcome: str) -> str:
    """The ACTIONS annotation with one more action, the oldest dropped beyond ACTIONS_KEPT."""
    done = applied(node)
    done.pop(action_id, None)
    done[action_id] = outcome
    kept = dict(list(done.items())[-ACTIONS_KEPT:])
    return json.dumps(kept, separators=(",", ":"))


def ready(node: Any) -> bool | None:
    """The Ready condition: True, False (False or Unknown), None when the node has none."""
    for condition in (node.status.conditions or []) if node.status is not None else []:
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return None


@dataclass(frozen=True)
class Place:
    pool: str
    zone: str


def place(node: Any, pool_label: str = "") -> Place:
    """The node's pool (the configured label, then GKE's, then EKS's) and zone."""
    own = node_labels(node)
    pool = next((own[k] for k in (pool_label, *POOL_LABELS) if k and own.get(k)), UNKNOWN)
    zone = next((own[k] for k in ZONE_LABELS if own.get(k)), UNKNOWN)
    return Place(_name(pool), _name(zone))


def _name(value: str) -> str:
    return value if _NAME.match(value) else UNKNOWN


def accelerator(node: Any) -> str:
    own = node_labels(node)
    found = next((own[k] for k in ACCELERATOR_LABELS if own.get(k)), "none")
    return found.removesuffix(SHARED_SUFFIX)[:256] or "none"  # a shared GPU is the same model


def capacity(node: Any) -> int:
    """Physical GPUs or TPU chips of the node, 0 when it has none: GFD's gpu.count when the
    node has it, else status.capacity divided by the sharing replicas (time-slicing, MPS)."""
    own = node_labels(node)
    physical = _count(own.get(GPU_COUNT))
    if physical is not None:
        return physical
    found = (node.status.capacity or {}) if node.status is not None else {}
    for resource in CAPACITY_RESOURCES:
        advertised = _count(found.get(resource))
        if advertised is None:
            continue
        replicas = _count(own.get(GPU_REPLICAS)) if resource.startswith("nvidia.com/") else None
        return advertised // replicas if replicas else advertised
    return 0


def _count(text: Any) -> int | None:
    try:
        return max(0, min(100_000, int(str(text))))
    except ValueError:
        return None


def inventory(node: Any, cluster: str, ts_ms: int, pool_label: str = "") -> Inventory:
    """The node as an inventory/1 record (fleet.inventory, key cluster/name)."""
    where = place(node, pool_label)
    own = node_labels(node)
    extra: dict[str, str] = {}
    for k, short in INVENTORY_LABELS.items():
        if own.get(k):
            extra.setdefault(short, own[k][:256])
    return Inventory(
        ts=ts_ms,
        cluster=cluster,
        kind="node",
        name=node.metadata.name,
        pool=where.pool,
        zone=where.zone,
        accelerator=accelerator(node),
        capacity=capacity(node),
        labels=extra,
        source="kubernetes",
    )


Change = tuple[str, str | None, str]  # (node_event kind, action_id, reason)


def changes(
    old: Any | None, new: Any, held_annotation: str, maintenance_label: str
) -> list[Change]:
    """What a person, the cloud or a repair controller changed between two versions of a
    node. FleetPulse's own cordons and uncordons are left out: the actuator echoes those."""
    if old is None:
        return [("created", None, "node object created")]
    found: list[Change] = []
    found += _cordon_change(old, new)
    was, now = ready(old), ready(new)
    if was is not None and now is not None and was != now:  # not a kubelet's first report
        found.append(("ready" if now else "not_ready", None, "Ready condition changed"))
    for mark, is_label in ((held_annotation, False), (maintenance_label, True)):
        if not mark:
            continue
        had, has = _marked(old, mark, is_label), _marked(new, mark, is_label)
        if has and not had:
            found.append(("held", None, f"{mark} set by a person"))
        elif had and not has and not cordoned(new):
            found.append(("uncordoned", None, f"{mark} removed by a person"))
    released = node_annotations(old).get(RELEASED) != node_annotations(new).get(RELEASED)
    if REPAIR_LABEL in node_labels(old) and REPAIR_LABEL not in node_labels(new) and not released:
        # (a release removes the label too: a person ended it, nothing was repaired)
        action_id = node_annotations(old).get(REPAIR_ACTION_ID)
        repair = node_labels(old)[REPAIR_LABEL]
        why = f"{repair} done (the repair controller removed the label)"
        found.append(("repaired", action_id, why))
    return found


def _marked(node: Any, mark: str, is_label: bool) -> bool:
    return mark in (node_labels(node) if is_label else node_annotations(node))


def _cordon_change(old: Any, new: Any) -> list[Change]:
    if cordoned(new) and not cordoned(old):
        if cordoned_by_us(new) is not None:
            return []  # our cordon: the actuator echoes it with its action_id
        return [("cordoned", None, "cordoned by a person (spec.unschedulable)")]
    if cordoned(old) and not cordoned(new):
        if CORDONED_BY in node_annotations(old) and CORDONED_BY not in node_annotations(new):
            return []  # our uncordon (it removes the annotation in the same patch)
        return [("uncordoned", None, "uncordoned by a person")]
    return []
