"""The capacity fold's state, and the fold: inventory, node states, capacity events and
utilization in, one fleet-wide state out (updated in place).

The state is what the capacity view needs and no more, so it stays small on a large fleet:
per member (node or slice) its place, devices, health, maintenance and each device's latest
window; per zone and type the quota series (a window of it), reservations and the times of
the last hour's stock-outs, queued waits and preemptions; per snapshot key the last hour's
device-seconds and useful device-seconds. It is a msgspec Struct so a driver can keep it in a
table. Its clock is the newest event time seen of node states, capacity events and
utilization (an inventory record's time is when it was listed): pure, no wall clock.

Membership comes from the inventory only (DESIGN §1): a node state or utilization row for a
target the inventory does not list changes nothing.
"""

from __future__ import annotations

import msgspec

from pipeline.capacity.repair import RepairState
from pipeline.capacity.repair import on_node_state as repair_on_node_state
from pipeline.catalog.accelerators import canonical_type
from pipeline.model import CapacityEvent, Event, Inventory, NodeState, QuotaInfo, Utilization

HOUR_MS = 3_600_000
QUOTA_POINTS_MAX = 512  # a day of 3-minute points, with room; the fit reads a window of it
EVENTS_KEPT_MS = HOUR_MS  # stock-outs, queued waits, preemptions: only the last hour counts
SPOT_LABELS = {
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
}
MODEL_LABEL = "provisioning_model"  # set by the capacity adapter from the VM's scheduling


class Member(msgspec.Struct, kw_only=True):
    """One node or slice of the inventory."""

    key: str  # the snapshot key: region/zone/type/model
    devices: int
    health: str = "healthy"  # the health machine's state name
    maintenance: str = ""  # "", "announced" or "ongoing"
    heard_ms: int = 0  # end of its newest utilization window (or its inventory time)
    used: dict[str, tuple[int, bool, float]] = {}  # device -> (window start, allocated, util %)


class Place(msgspec.Struct, kw_only=True):
    """One accelerator type in one zone: what the cloud says of it."""

    quota_metric: str = ""
    quota: list[tuple[int, float, float]] = []  # (ts, usage, limit), oldest first
    reservations: dict[str, tuple[int, int]] = {}  # name -> (devices reserved, in use)
    stockouts: list[int] = []  # event times within the last hour
    queued: list[int] = []
    preemptions: list[int] = []


class CapacityState(msgspec.Struct, kw_only=True):
    clock_ms: int = 0
    members: dict[str, Member] = {}  # cluster/name
    places: dict[str, Place] = {}  # zone/type
    usage: dict[str, dict[int, tuple[float, float]]] = {}  # key -> window -> (dev s, useful s)
    emitted: dict[str, tuple[int, str]] = {}  # key -> (ts, digest) of the last snapshot sent
    firing: dict[str, int] = {}  # crunch scope (region/type) -> since, while it holds
    repairs: RepairState = msgspec.field(default_factory=RepairState)  # time back in service
    overdue: dict[str, int] = {}  # targets alerted as out of service too long -> since
    advised: dict[str, tuple[int, str]] = {}  # type/count -> (ts, advice_id) last sent


def region_of(zone: str) -> str:
    """`us-central1-a` → `us-central1`; a name without a zone suffix is its own region."""
    head, sep, tail = zone.rpartition("-")
    return head if sep and len(tail) == 1 and tail.isalpha() else zone


def snapshot_key(zone: str, accelerator_type: str, model: str) -> str:
    return f"{region_of(zone)}/{zone}/{accelerator_type}/{model}"


def provisioning_model(labels: dict[str, str]) -> str:
    """spot, reserved, flex-start or on-demand, from the member's labels."""
    named = labels.get(MODEL_LABEL, "").lower().replace("_", "-")
    if named in ("spot", "preemptible") or any(labels.get(k) == v for k, v in SPOT_LABELS.items()):
        return "spot"
    reserved = labels.get("cloud.google.com/reservation-name")
    if named in ("reserved", "reservation-bound") or reserved:
        return "reserved"
    if named == "flex-start" or labels.get("cloud.google.com/gke-flex-start") == "true":
        return "flex-start"
    return "on-demand"


def type_of(name: str | None) -> str | None:
    """The canonical type, or the name itself when the catalog does not know it (lower case,
    so it can still be counted as its own type)."""
    if not name:
        return None
    return canonical_type(name) or name.lower()


# --- the fold ------------------------------------------------------------------------------


def fold(state: CapacityState, value: Event) -> set[str]:
    """Take one input into the state; the snapshot keys it may have changed."""
    if isinstance(value, Utilization):
        return on_utilization(state, value)
    if isinstance(value, NodeState):
        return on_node_state(state, value)
    if isinstance(value, CapacityEvent):
        return on_capacity(state, value)
    if isinstance(value, Inventory):
        return on_inventory(state, value)
    return set()


def on_inventory(state: CapacityState, record: Inventory) -> set[str]:
    accelerator = type_of(record.accelerator) or "unknown"
    key = snapshot_key(record.zone, accelerator, provisioning_model(dict(record.labels)))
    name = f"{record.cluster}/{record.name}"
    old = state.members.get(name)
    # the record's time is when it was listed, not a capacity event: it does not move the clock
    # (a replay's inventory, listed today, would put a run of yesterday's events in the past)
    if old is not None and old.key == key:
        old.devices = record.capacity
        return {key}
    state.members[name] = Member(key=key, devices=record.capacity, heard_ms=record.ts)
    if old is not None:
        state.members[name].health = old.health
        return {key, old.key}
    return {key}


def forget(state: CapacityState, cluster_name: str) -> set[str]:
    """An inventory tombstone: the member left the fleet (and any outage of it with it)."""
    member = state.members.pop(cluster_name, None)
    state.repairs.open.pop(cluster_name, None)
    state.overdue.pop(cluster_name, None)
    return set() if member is None else {member.key}


def on_node_state(state: CapacityState, record: NodeState) -> set[str]:
    _tick(state, record.ts)
    member = state.members.get(f"{record.target.cluster}/{record.target.name}")
    if member is None:
        return set()
    repair_on_node_state(state.repairs, record, member.key.split("/")[2])
    if member.health == record.state:
        return set()
    member.health = record.state
    return {member.key}


def on_utilization(state: CapacityState, row: Utilization) -> set[str]:
    end = row.window_start + row.window_s * 1000
    _tick(state, end)
    member = state.members.get(f"{row.cluster}/{row.slice or row.node}")
    if member is None:
        return set()
    device = f"{row.node}:{row.device}"
    previous = member.used.get(device)
    if previous is None or previous[0] <= row.window_start:
        member.used[device] = (row.window_start, row.allocated, row.util_mean)
    member.heard_ms = max(member.heard_ms, end)
    windows = state.usage.setdefault(member.key, {})
    device_s, useful_s = windows.get(row.window_start, (0.0, 0.0))
    useful_s += row.window_s * row.util_mean / 100
    windows[row.window_start] = (device_s + row.window_s, useful_s)
    return {member.key}


def on_capacity(state: CapacityState, event: CapacityEvent) -> set[str]:
    _tick(state, event.ts)
    member = _member_of(state, event)
    if event.kind.startswith("MAINTENANCE_"):
        return _maintenance(member, event)
    accelerator = type_of(event.accelerator_type) or (
        type_of(event.quota.metric) if event.quota is not None else None
    )
    if accelerator is None and member is not None:
        accelerator = member.key.split("/")[2]
    if accelerator is None:
        return set()
    place = state.places.setdefault(f"{event.zone}/{accelerator}", Place())
    _on_place(place, event)
    return keys_of_place(state, event.zone, accelerator)


def keys_of_place(state: CapacityState, zone: str, accelerator: str) -> set[str]:
    """The snapshot keys of a zone and type: one per provisioning model its members use (an
    on-demand key when it has none, so a quota without members is still seen)."""
    prefix = f"{region_of(zone)}/{zone}/{accelerator}/"
    keys = {m.key for m in state.members.values() if m.key.startswith(prefix)}
    return keys or {prefix + "on-demand"}


def _on_place(place: Place, event: CapacityEvent) -> None:
    kind = event.kind
    if kind.startswith("QUOTA_") and event.quota is not None:
        place.quota_metric = event.quota.metric
        place.quota = _add_point(place.quota, _quota_point(place, event, event.quota))
    elif kind == "RESERVATION_CHANGED":
        name, figures = reservation_figures(event)
        if figures is None:
            place.reservations.pop(name, None)
        else:
            place.reservations[name] = figures
    elif kind == "STOCKOUT":
        place.stockouts = _recent([*place.stockouts, event.ts], event.ts)
    elif kind == "QUEUED_RESOURCE_STATE" and event.state == "WAITING_FOR_RESOURCES":
        place.queued = _recent([*place.queued, event.ts], event.ts)
    elif kind == "PREEMPTION":
        place.preemptions = _recent([*place.preemptions, event.ts], event.ts)


def _quota_point(
    place: Place, event: CapacityEvent, quota: QuotaInfo
) -> tuple[int, float, float]:
    """A quota reading as (ts, usage, limit). QUOTA_EXCEEDED: usage at the limit. QUOTA_CHANGED
    says the limit only (the Cloud Monitoring adapter sends usage 0 with it): the usage is the
    reading's at that time, else the latest before it."""
    limit = float(quota.limit)
    if event.kind == "QUOTA_EXCEEDED":
        return event.ts, limit, limit
    if event.kind == "QUOTA_CHANGED":
        earlier = [p for p in place.quota if p[0] <= event.ts]
        return event.ts, earlier[-1][1] if earlier else float(quota.usage), limit
    return event.ts, float(quota.usage), limit


def reservation_figures(event: CapacityEvent) -> tuple[str, tuple[int, int] | None]:
    """A RESERVATION_CHANGED's reservation name and (reserved, in use); None: it is gone.

    The reservation adapter says it in `quota` (metric = the reservation's name, limit = devices
    reserved, usage = in use) and `state` (READY, DELETING...); older records only said
    `state` "count=N"."""
    if event.quota is not None:
        gone = event.state in ("DELETING", "DELETED", "EXPIRED")
        figures = (int(event.quota.limit), int(event.quota.usage))
        return event.quota.metric, None if gone else figures
    name = event.target or event.event_id
    text = (event.state or "").removeprefix("count=")
    return name, (int(text), 0) if text.isdigit() else None


def _maintenance(member: Member | None, event: CapacityEvent) -> set[str]:
    if member is None:
        return set()
    member.maintenance = {
        "MAINTENANCE_SCHEDULED": "announced",
        "MAINTENANCE_STARTED": "ongoing",
    }.get(event.kind, "")
    return {member.key}


def _member_of(state: CapacityState, event: CapacityEvent) -> Member | None:
    if event.target is None or event.cluster is None:
        return None
    return state.members.get(f"{event.cluster}/{event.target}")


def _add_point(
    points: list[tuple[int, float, float]], point: tuple[int, float, float]
) -> list[tuple[int, float, float]]:
    kept = [p for p in points if p[0] != point[0]]  # a replayed point replaces itself
    kept.append(point)
    if kept[-1][0] < kept[-2 if len(kept) > 1 else -1][0]:
        kept.sort()
    return kept[-QUOTA_POINTS_MAX:]


def _recent(times: list[int], now: int) -> list[int]:
    return sorted(t for t in times if t > now - EVENTS_KEPT_MS)


def _tick(state: CapacityState, ts: int) -> None:
    if ts > state.clock_ms:
        state.clock_ms = ts
