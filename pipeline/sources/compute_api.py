"""GPU instances from the Compute Engine API (`google-cloud-compute`, REST): members and their
upcoming maintenance (`Instance.resource_status.upcoming_maintenance`, §6.4).

`InstancesClient.aggregated_list` over the project (every zone, or only `capacity.zones`).
A spot (`scheduling.provisioning_model` SPOT) or preemptible instance that goes STOPPING /
TERMINATED has been preempted: one PREEMPTION (source `gcp.compute.preemption`).
An instance is a fleet member when it has guest accelerators and names its cluster and pool
in its labels: GKE sets `goog-k8s-cluster-name` and `goog-k8s-node-pool-name` on its nodes'
instances (`cluster` / `pool` are read for VMs outside GKE). Others are not ours: skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.sources.gcp_clients import api_call
from pipeline.sources.maintenance import Member, Upcoming

SOURCE = "gcp.compute.maintenance"
PREEMPTION_SOURCE = "gcp.compute.preemption"
CLUSTER_LABELS = ("goog-k8s-cluster-name", "cluster")
POOL_LABELS = ("goog-k8s-node-pool-name", "pool")


def instance_member(instance: Any) -> Member | None:
    """A GPU instance → Member; None for an instance that is not a labelled GPU node."""
    labels = dict(instance.labels)
    cluster = next((labels[k] for k in CLUSTER_LABELS if labels.get(k)), "")
    pool = next((labels[k] for k in POOL_LABELS if labels.get(k)), "")
    accelerators = list(instance.guest_accelerators)
    if not (cluster and pool and accelerators):
        return None
    return Member(
        cluster=cluster,
        pool=pool,
        zone=_last(instance.zone),
        kind="node",
        name=instance.name,
        accelerator=_last(accelerators[0].accelerator_type),
        capacity=sum(int(a.accelerator_count) for a in accelerators),
        labels=labels,
    )


def instance_state(instance: Any) -> str:
    """PREEMPTED for a spot or preemptible VM that stopped (GCE stops them to preempt), else
    the instance status."""
    scheduling = instance.scheduling
    spot = scheduling.provisioning_model == "SPOT" or bool(scheduling.preemptible)
    if spot and instance.status in ("STOPPING", "TERMINATED"):
        return "PREEMPTED"
    return str(instance.status)


def instance_upcoming(instance: Any) -> Upcoming | None:
    status = instance.resource_status
    if "upcoming_maintenance" not in status:
        return None
    upcoming = status.upcoming_maintenance
    if not upcoming.window_start_time:
        return None
    return Upcoming(
        status=upcoming.maintenance_status or "UNKNOWN",
        kind=upcoming.type_ or "SCHEDULED",
        start=upcoming.window_start_time,
        end=upcoming.window_end_time,
    )


def list_instances(
    client: Any, project: str, zones: Sequence[str], page_size: int, timeout_s: float
) -> list[Any]:
    """Every instance of the project (of `zones` when given), in zone then name order."""
    from google.cloud import compute_v1

    request = compute_v1.AggregatedListInstancesRequest(
        project=project, max_results=page_size
    )

    def call() -> list[tuple[str, Any]]:
        return [
            (scope, instance)
            for scope, scoped in client.aggregated_list(request=request, timeout=timeout_s)
            for instance in scoped.instances
        ]

    found = api_call("compute instances.aggregatedList", call)
    wanted = set(zones)
    chosen = [i for scope, i in found if not wanted or _last(scope) in wanted]
    return sorted(chosen, key=lambda i: (_last(i.zone), i.name))


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]
