"""The Kubernetes actuator's own defences: what it refuses whatever the policy decided.

The record's credibility (expires_at, ts, key) and the removal cap are every actuator's
(pipeline/actuate/defences.py, re-exported here); what is Kubernetes' own: an action must name
the pool and zone its nodes are labelled with, and a slice must select TPU nodes only (its
label may be a node-pool label, which a GPU pool has too).

Pure: the nodes come in as the API server returned them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.actuate.defences import (
    REMOVALS,
    Refusal,
    RemovalCap,
    credible,
    in_words,
)
from pipeline.config import KubernetesSettings
from pipeline.kube import nodes
from pipeline.model import REPAIR_KINDS, Action

__all__ = ["GPU_RESOURCE", "REMOVALS", "REPAIR_KINDS", "Refusal", "RemovalCap", "agrees",
           "credible", "in_words", "is_gpu_node"]  # fmt: skip
GPU_RESOURCE = "nvidia.com/gpu"


def agrees(action: Action, found: Sequence[Any], settings: KubernetesSettings) -> Refusal | None:
    """The target's nodes as the API server has them: each labelled with the action's pool and
    zone (as the watcher reads them, so as the inventory has them); a slice TPU nodes only."""
    target = action.target
    for node in found:
        where = nodes.place(node, settings.pool_label)
        if (where.pool, where.zone) != (target.pool, target.zone):
            return Refusal("labels", f"node {node.metadata.name} is in pool {where.pool}, zone "
                           f"{where.zone}; the action names pool {target.pool}, zone "
                           f"{target.zone}")  # fmt: skip
        if target.kind == "slice":
            refusal = _tpu_only(node, target.name, settings)
            if refusal is not None:
                return refusal
    return None


def _tpu_only(node: Any, slice_name: str, settings: KubernetesSettings) -> Refusal | None:
    name = node.metadata.name
    if is_gpu_node(node):
        return Refusal("gpu_slice", f"slice {slice_name} selects GPU node {name}: a slice "
                       f"selector never matches a GPU node pool")  # fmt: skip
    if not nodes.node_labels(node).get(settings.tpu_label):
        return Refusal("gpu_slice", f"slice {slice_name} selects node {name}, which has no "
                       f"{settings.tpu_label} label: a slice is TPU nodes only")  # fmt: skip
    return None


def is_gpu_node(node: Any) -> bool:
    labels = nodes.node_labels(node)
    if labels.get("nvidia.com/gpu.product") or labels.get("nvidia.com/gpu.present"):
        return True
    if labels.get("cloud.google.com/gke-accelerator", "").startswith("nvidia"):
        return True
    capacity = (node.status.capacity or {}) if node.status is not None else {}
    return str(capacity.get(GPU_RESOURCE, "0")) not in ("", "0")
