"""TPU slices and queued resources from the Cloud TPU API (`google-cloud-tpu`, v2alpha1, gRPC).

`TpuClient.list_nodes` (every zone: location `-`, or each of `capacity.zones`): members (labels
`cluster`, `pool`; `accelerator_type`, `accelerator_config.topology`), their
`upcoming_maintenance` (§6.3) and state PREEMPTED (→ PREEMPTION once). `list_queued_resources`:
each state change (CREATING → ACCEPTED → WAITING_FOR_RESOURCES → PROVISIONING → ACTIVE, or
FAILED / SUSPENDED …) is a QUEUED_RESOURCE_STATE with the previous state from the checkpoint; a
FAILED one whose `failed_data.error` is RESOURCE_EXHAUSTED (no capacity in time) is also a
STOCKOUT of its accelerator type in its zone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from pipeline.catalog import accelerator_chips, accelerator_type_of
from pipeline.ids import stable_id
from pipeline.model import CapacityEvent
from pipeline.sources.base import Parsed, add_validated
from pipeline.sources.gcp_clients import api_call
from pipeline.sources.maintenance import Member, Upcoming

NODE_SOURCE = "gcp.tpu.node"
QUEUED_SOURCE = "gcp.tpu.queued_resource"
RESOURCE_EXHAUSTED = 8  # google.rpc.Code
QUEUED_CLUSTER, QUEUED_POOL = "queued-resources", "queued"  # as the simulator names them


def node_member(node: Any) -> Member | None:
    """The node as an inventory member (labels `cluster` and `pool` required). A node given
    only an `acceleratorConfig` (type enum and topology) is as full a member as one given an
    `acceleratorType`: its type is named from the config."""
    labels = dict(node.labels)
    cluster, pool = labels.get("cluster", ""), labels.get("pool", "")
    if not (cluster and pool):
        return None
    accelerator, topology = accelerator_of(node)
    return Member(
        cluster=cluster,
        pool=pool,
        zone=_location(node.name),
        kind="slice",
        name=node.name.rsplit("/", 1)[-1],
        accelerator=accelerator,
        capacity=chips(accelerator, topology),
        labels={**labels, **({"topology": topology} if topology else {})},
    )


def accelerator_of(node: Any) -> tuple[str, str]:
    """(accelerator type, topology) of a TPU API Node: its `accelerator_type`, else the type
    its `accelerator_config` names ("V5P" + "2x2x2" -> "v5p-16"); "" where neither says."""
    config = node.accelerator_config if "accelerator_config" in node else None
    topology = str(config.topology) if config is not None else ""
    if node.accelerator_type or config is None or not config.type_:
        return str(node.accelerator_type), topology
    try:
        return accelerator_type_of(config.type_.name, topology), topology
    except ValueError:
        return "", topology  # TYPE_UNSPECIFIED, or a type this catalog does not know


def node_upcoming(node: Any) -> Upcoming | None:
    if "upcoming_maintenance" not in node:
        return None
    upcoming = node.upcoming_maintenance
    if not upcoming.window_start_time:
        return None
    return Upcoming(
        status=upcoming.maintenance_status.name,
        kind=upcoming.type_.name,
        start=upcoming.window_start_time,
        end=upcoming.window_end_time,
    )


def preemptions(
    seen: dict[str, str],
    nodes: list[tuple[Member, str]],
    now_ms: int,
    source: str = NODE_SOURCE,
) -> Parsed:
    """PREEMPTION for a member newly in state PREEMPTED; `seen` (key → state) is updated."""
    parsed = Parsed()
    for member, state in nodes:
        before = seen.get(member.key)
        seen[member.key] = state
        if state != "PREEMPTED" or before == "PREEMPTED":
            continue
        # numbered, so a second preemption is a new event and a re-read one is the same
        number = int(seen.get(f"{member.key}#preemptions", "0")) + 1
        seen[f"{member.key}#preemptions"] = str(number)
        make = functools.partial(
            CapacityEvent,
            event_id=stable_id("cap", source, member.key, "PREEMPTION", number),
            ts=now_ms,
            provider="gcp",
            source=source,
            kind="PREEMPTION",
            severity="warning",
            region=member.zone.rsplit("-", 1)[0],
            zone=member.zone,
            cluster=member.cluster,
            pool=member.pool,
            target_kind=member.kind,  # type: ignore[arg-type]
            target=member.name,
            accelerator_type=member.accelerator,
            state=state,
            previous_state=before,
            message=f"{member.kind} {member.name} was preempted",
        )
        add_validated(parsed, make, f"{member.key} PREEMPTION")
    return parsed


def queued_resource_events(seen: dict[str, str], queued: list[Any], now_ms: int) -> Parsed:
    """QUEUED_RESOURCE_STATE (and STOCKOUT) per state change; `seen` (name → state) updated."""
    parsed = Parsed()
    for resource in queued:
        name = resource.name.rsplit("/", 1)[-1]
        state = resource.state.state.name
        before = seen.get(resource.name)
        if state == before:
            continue
        zone = _location(resource.name)
        specs = list(resource.tpu.node_spec)
        accelerator = accelerator_of(specs[0].node)[0] if specs else ""
        error = resource.state.failed_data.error if state == "FAILED" else None
        code = error.code if error is not None else 0
        base = {
            "provider": "gcp",
            "region": zone.rsplit("-", 1)[0],
            "zone": zone,
            "accelerator_type": accelerator or None,
        }
        transition = functools.partial(
            CapacityEvent,
            event_id=stable_id("cap", QUEUED_SOURCE, resource.name, state, before or ""),
            ts=now_ms,
            source=QUEUED_SOURCE,
            kind="QUEUED_RESOURCE_STATE",
            severity="warning" if state == "FAILED" else "info",
            cluster=QUEUED_CLUSTER,
            pool=QUEUED_POOL,
            target_kind="slice",
            target=name,
            state=state,
            previous_state=before,
            error_code=_code_name(code) if error is not None else None,
            message=f"queued resource {name}: {before or 'new'} -> {state}"
            + (f": {error.message}" if error is not None and error.message else ""),
            **base,  # type: ignore[arg-type]
        )
        events = [transition]
        if code == RESOURCE_EXHAUSTED:
            events.append(
                functools.partial(
                    CapacityEvent,
                    event_id=stable_id("cap", QUEUED_SOURCE, resource.name, "STOCKOUT"),
                    ts=now_ms,
                    source=QUEUED_SOURCE,
                    kind="STOCKOUT",
                    severity="warning",
                    error_code="RESOURCE_EXHAUSTED",
                    message=f"no {accelerator or 'TPU'} capacity in {zone} for queued resource "
                    f"{name}" + (f": {error.message}" if error and error.message else ""),
                    **base,  # type: ignore[arg-type]
                )
            )
        if all(add_validated(parsed, make, f"{resource.name} {state}") for make in events):
            seen[resource.name] = state
    return parsed


def _code_name(code: int) -> str:
    import grpc

    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return f"CODE_{code}"


def _location(name: str) -> str:
    parts = name.split("/")
    return parts[parts.index("locations") + 1] if "locations" in parts else ""


def chips(accelerator_type: str, topology: str) -> int:
    """Chips of a slice: the topology's product, else the accelerator type's count read as its
    generation counts (TensorCores for v2, v3, v4, v5p: two per chip; chips for v5e, v6e);
    0 when neither says."""
    dims = [int(d) for d in topology.split("x") if d.isdigit()]
    if dims:
        return math.prod(dims)
    try:
        return accelerator_chips(accelerator_type)
    except ValueError:
        return 0


def parents(project: str, zones: Sequence[str]) -> list[str]:
    return [f"projects/{project}/locations/{zone}" for zone in (zones or ["-"])]


def list_nodes(client: Any, parent: str, page_size: int, timeout_s: float) -> list[Any]:
    from google.cloud import tpu_v2alpha1

    request = tpu_v2alpha1.ListNodesRequest(parent=parent, page_size=page_size)
    return api_call(
        f"tpu list_nodes {parent}",
        lambda: list(client.list_nodes(request=request, timeout=timeout_s)),
    )


def list_queued(client: Any, parent: str, page_size: int, timeout_s: float) -> list[Any]:
    from google.cloud import tpu_v2alpha1

    request = tpu_v2alpha1.ListQueuedResourcesRequest(parent=parent, page_size=page_size)
    return api_call(
        f"tpu list_queued_resources {parent}",
        lambda: list(client.list_queued_resources(request=request, timeout=timeout_s)),
    )
