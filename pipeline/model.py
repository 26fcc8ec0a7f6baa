"""Event types: one msgspec Struct per topic value, mirrored by a JSON Schema in schemas/.

Every value carries `schema: "<name>/<version>"`; a field change means a new version (a new
Struct and a new schema file), never a silent edit. Timestamps are Unix epoch milliseconds,
event time. Names that arrive from the outside world (cluster, node, pool, zone, slice) are
constrained here, once, because they later become file paths, metric labels and SQL values.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

# 2001-09-09 .. 2286-11-20 in ms: catches seconds-instead-of-milliseconds at the door.
TimestampMs = Annotated[int, Meta(ge=1_000_000_000_000, le=9_999_999_999_999)]
# Kubernetes node names are DNS subdomains (253); we allow dots, dashes, underscores, colons
# but never a leading dot or a slash, so a name can never climb out of a lake directory.
Name = Annotated[
    str, Meta(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")
]
Text = Annotated[str, Meta(max_length=4096)]
ShortText = Annotated[str, Meta(max_length=256)]
Id = Annotated[str, Meta(min_length=8, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
NonNegInt = Annotated[int, Meta(ge=0)]
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]

TargetKind = Literal["node", "slice"]
EntityKind = Literal["gpu", "tpu_chip", "ici_link", "node", "slice"]
Severity = Literal["info", "warning", "critical"]
ActionKind = Literal[
    "cordon", "uncordon", "drain", "reset_gpu", "reboot", "repair", "replace", "repair_slice"
]
RecommendedAction = Literal[
    "none", "watch", "cordon", "drain", "reset_gpu", "reboot", "repair", "replace", "repair_slice"
]
HealthStateName = Literal[
    "healthy", "suspect", "degraded", "cordoned", "draining", "repairing", "probation"
]


def _check_finite(where: str, metrics: dict[str, float]) -> None:
    # Fast path for the hot decode loop: a sum of finite values is finite (or overflows to
    # inf, which only sends us down the slow path); NaN and inf always propagate.
    if math.isfinite(sum(metrics.values())):
        return
    for name, value in metrics.items():
        if not math.isfinite(value):
            raise ValueError(f"{where}.metrics.{name}: expected a finite number, got {value!r}")


class Event(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every topic value (kw_only so defaults can follow required fields)."""


# --- inputs -------------------------------------------------------------------------------


class GpuReading(Event, frozen=True, kw_only=True):
    index: Annotated[int, Meta(ge=0, le=63)]
    uuid: Annotated[str, Meta(max_length=64, pattern=r"^GPU-[0-9a-fA-F-]{8,60}$")]
    pci_bus_id: Annotated[str, Meta(max_length=32, pattern=r"^[0-9a-fA-F:.]+$")]
    model: ShortText
    job: Name | None = None
    # dcgm-exporter metric names, raw values; counters stay raw (rates are derived in detect).
    metrics: dict[Annotated[str, Meta(pattern=r"^DCGM_[A-Z0-9_]+$")], float]

    def __post_init__(self) -> None:
        _check_finite(f"gpu {self.index}", self.metrics)


class GpuSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="gpu_sample/1"):
    """One node's dcgm-exporter scrape (fleet.telemetry.gpu, key = node)."""

    ts: TimestampMs
    cluster: Name
    node: Name
    pool: Name
    zone: Name
    driver: ShortText
    gpus: list[GpuReading]


class TpuChipReading(Event, frozen=True, kw_only=True):
    chip_id: Annotated[int, Meta(ge=0, le=100_000)]
    coords: list[NonNegInt]
    job: Name | None = None
    # duty_cycle_pct, tensorcore_util, hbm_used_bytes, hbm_total_bytes, ...
    metrics: dict[Annotated[str, Meta(pattern=r"^[a-z0-9_]+$")], float]

    def __post_init__(self) -> None:
        _check_finite(f"chip {self.chip_id}", self.metrics)


class TpuSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="tpu_sample/1"):
    """One TPU host's chip metrics (fleet.telemetry.tpu, key = slice)."""

    ts: TimestampMs
    cluster: Name
    node: Name
    pool: Name
    zone: Name
    slice: Name
    accelerator_type: Annotated[str, Meta(pattern=r"^(v[0-9a-z]+|tpu7x)-[0-9]+$")]
    topology: Annotated[str, Meta(pattern=r"^[0-9]+(x[0-9]+){1,2}$")]
    worker_id: NonNegInt
    chips: list[TpuChipReading]


class IciLink(Event, frozen=True, kw_only=True):
    chip_id: NonNegInt
    port: Annotated[int, Meta(ge=0, le=15)]
    peer_chip_id: NonNegInt
    # libtpu ici_link_health scale as observed in the field: 0 = healthy; higher is worse,
    # 10 = down. The scale is undocumented upstream (reference/data-shapes.md §3.3).
    health: Annotated[int, Meta(ge=0, le=10)]
    flits_tx: NonNegInt
    flits_rx: NonNegInt
    errors: NonNegInt | None = None


class IciSample(Event, frozen=True, kw_only=True, tag_field="schema", tag="ici_sample/1"):
    """One TPU host's ICI link counters (fleet.telemetry.ici, key = slice)."""

    ts: TimestampMs
    cluster: Name
    node: Name
    pool: Name
    zone: Name
    slice: Name
    links: list[IciLink]


class XidEvent(Event, frozen=True, kw_only=True, tag_field="schema", tag="xid_event/1"):
    """One NVRM Xid kernel-log line (fleet.events.xid, key = node)."""

    ts: TimestampMs
    cluster: Name
    node: Name
    pool: Name
    zone: Name
    # normalised BDF without function: "0000:53:00" (kernel form), see codec.normalize_pci
    pci_bus_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$")]
    gpu_index: Annotated[int, Meta(ge=0, le=63)] | None = None
    uuid: ShortText | None = None
    xid: Annotated[int, Meta(ge=0, le=100_000)]
    pid: NonNegInt | None = None
    process: ShortText | None = None
    job: Name | None = None
    message: Text
    source: Literal["kernel_log", "dcgm", "simulator"]


class NodeEvent(Event, frozen=True, kw_only=True, tag_field="schema", tag="node_event/1"):
    """Someone else changed a node or slice (fleet.events.node): the health machine respects it.

    `action_id` is set when an actuator reports carrying out one of our own actions; without it
    the change is a human or cloud override.
    """

    ts: TimestampMs
    cluster: Name
    target_kind: TargetKind
    target: Name
    pool: Name
    zone: Name
    kind: Literal["cordoned", "uncordoned", "drained", "deleted", "repaired", "created"]
    actor: ShortText
    action_id: Id | None = None
    reason: Text = ""


class Inventory(Event, frozen=True, kw_only=True, tag_field="schema", tag="inventory/1"):
    """One node or slice as the fleet's owner lists it (fleet.inventory, compacted, key =
    cluster/name; a tombstone when it leaves). The only source of pool, zone and cluster
    membership: budgets count these members, and telemetry that disagrees is not believed."""

    ts: TimestampMs
    cluster: Name
    kind: TargetKind
    name: Name
    pool: Name
    zone: Name
    accelerator: ShortText
    capacity: Annotated[int, Meta(ge=0, le=100_000)]  # GPUs of a node, chips of a slice
    leaf_switch: Name | None = None
    rail: Name | None = None
    labels: dict[ShortText, ShortText] = {}
    source: ShortText = "file"


class PolicyRelease(
    Event, frozen=True, kw_only=True, tag_field="schema", tag="policy_release/1"
):
    """A person releases a common-cause pause (fleet.events.policy, key = scope): removals for
    `check` in the scope go ahead again under the usual budgets, until the cause clears and a
    new one is seen. `fleetpulse policy release` writes it."""

    ts: TimestampMs
    check: ShortText
    scope: Literal["pool", "zone", "fleet"]
    name: ShortText  # cluster/pool, the zone, or "fleet"
    actor: ShortText
    reason: Text = ""


class QuotaInfo(Event, frozen=True, kw_only=True):
    metric: ShortText
    limit: float
    usage: float
    unit: ShortText = "count"


class MaintenanceWindow(Event, frozen=True, kw_only=True):
    start: TimestampMs
    end: TimestampMs
    notice_s: NonNegInt = 0


class CapacityEvent(Event, frozen=True, kw_only=True, tag_field="schema", tag="capacity_event/1"):
    """Quota, stock-out, reservation, queued-resource, maintenance or preemption signal
    (fleet.events.capacity, key = zone). Fields follow reference/data-shapes.md §6.5."""

    event_id: Id
    ts: TimestampMs
    provider: Literal["gcp", "aws", "azure", "onprem"]
    source: ShortText
    kind: Literal[
        "QUOTA_USAGE",
        "QUOTA_EXCEEDED",
        "QUOTA_CHANGED",
        "STOCKOUT",
        "QUEUED_RESOURCE_STATE",
        "PREEMPTION",
        "MAINTENANCE_SCHEDULED",
        "MAINTENANCE_STARTED",
        "MAINTENANCE_DONE",
        "HOST_ERROR",
        "RESERVATION_CHANGED",
    ]
    severity: Severity
    region: Name
    zone: Name
    cluster: Name | None = None
    pool: Name | None = None
    target_kind: TargetKind | None = None
    target: Name | None = None
    accelerator_type: ShortText | None = None
    quota: QuotaInfo | None = None
    window: MaintenanceWindow | None = None
    state: ShortText | None = None
    previous_state: ShortText | None = None
    error_code: ShortText | None = None
    message: Text = ""


# --- derived ------------------------------------------------------------------------------


class Target(Event, frozen=True, kw_only=True):
    """What an action applies to: a node, or a whole TPU slice (repaired as one unit)."""

    cluster: Name
    kind: TargetKind
    name: Name
    pool: Name
    zone: Name


class Entity(Event, frozen=True, kw_only=True):
    """What a finding is about: a device on a node/slice, a link, or the node/slice itself."""

    kind: EntityKind
    target: Target
    device: ShortText | None = None  # gpu index, chip id or "chip:port" of an ICI link


class Evidence(Event, frozen=True, kw_only=True):
    metric: ShortText
    value: float | None
    baseline: float | None
    score: float | None
    window_s: NonNegInt


class Finding(Event, frozen=True, kw_only=True, tag_field="schema", tag="finding/1"):
    """A verdict on an entity, HealthEvent-style (fleet.findings, key = node/slice).

    `healthy=True` findings clear a check; a `check="heartbeat"` finding says the target
    reported and nothing is wrong, which gives the health machine its event-time clock.
    """

    finding_id: Id
    ts: TimestampMs
    entity: Entity
    check: ShortText
    severity: Severity
    healthy: bool
    fatal: bool = False
    recommended_action: RecommendedAction
    evidence: Evidence | None = None
    message: Text = ""


class Reason(Event, frozen=True, kw_only=True):
    checks: list[ShortText]
    finding_ids: list[Id]
    summary: Text


class Proposal(Event, frozen=True, kw_only=True, tag_field="schema", tag="proposal/1"):
    """What the health machine wants done to a target (fleet.proposals, key = pool)."""

    proposal_id: Id
    ts: TimestampMs
    kind: ActionKind
    target: Target
    reason: Reason
    fatal: bool
    episode: Id
    state: HealthStateName


class Action(Event, frozen=True, kw_only=True, tag_field="schema", tag="action/1"):
    """The public contract for actuators (fleet.actions, key = node/slice)."""

    action_id: Id
    ts: TimestampMs
    kind: ActionKind
    target: Target
    reason: Reason
    dry_run: bool
    proposal_id: Id
    expires_at: TimestampMs | None = None


class NodeState(Event, frozen=True, kw_only=True, tag_field="schema", tag="node_state/1"):
    """Current health state of a node or slice (fleet.node-state, compacted, key = target)."""

    ts: TimestampMs
    target: Target
    state: HealthStateName
    since: TimestampMs
    episode: Id | None = None
    cordoned_by_us: bool = False
    human_hold: bool = False
    repairs: NonNegInt = 0
    last_action: ShortText | None = None
    open_checks: list[ShortText] = []


class Alert(Event, frozen=True, kw_only=True, tag_field="schema", tag="alert/1"):
    """Alertmanager-shaped alert (fleet.alerts, key = fingerprint); times are RFC 3339 as
    Alertmanager's API wants them, with `ts` in ms like every other topic."""

    ts: TimestampMs
    fingerprint: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}$")]
    status: Literal["firing", "resolved"]
    labels: dict[ShortText, ShortText]
    annotations: dict[ShortText, Text]
    startsAt: ShortText  # noqa: N815 - Alertmanager's field name
    endsAt: ShortText | None = None  # noqa: N815
    generatorURL: ShortText = ""  # noqa: N815


class Utilization(Event, frozen=True, kw_only=True, tag_field="schema", tag="utilization/1"):
    """One device over one event-time window (fleet.utilization, key = node/slice)."""

    window_start: TimestampMs
    window_s: Annotated[int, Meta(ge=1, le=86_400)]
    cluster: Name
    pool: Name
    zone: Name
    node: Name
    slice: Name | None = None
    device: ShortText
    accelerator: ShortText
    job: Name | None = None
    allocated: bool
    util_mean: Percent
    util_max: Percent
    mem_used_frac: Annotated[float, Meta(ge=0.0, le=1.0)]
    power_w_mean: float | None = None
    samples: Annotated[int, Meta(ge=1)]


class DeadLetter(Event, frozen=True, kw_only=True, tag_field="schema", tag="dead_letter/2"):
    """A record that could not be processed (fleet.dlq): coordinates, reason, raw bytes.

    v2 adds `reason`, short and machine-readable: "tombstone", "too_large", "too_deep",
    "invalid" (pipeline.errors.DecodeError), "error" (a stage raised), the door's refusals
    (ahead, behind, late, inventory_mismatch), "refused" (an alert sink said no for good)."""

    ts: TimestampMs
    topic: ShortText
    partition: int
    offset: int
    key: ShortText | None
    error: Text
    raw_b64: str
    reason: Annotated[str, Meta(max_length=64)] = ""


INPUT_TYPES: tuple[type[Event], ...] = (
    GpuSample,
    TpuSample,
    IciSample,
    XidEvent,
    NodeEvent,
    CapacityEvent,
    Inventory,
    PolicyRelease,
)
TOPIC_VALUES: dict[str, type[Event]] = {
    "gpu_sample": GpuSample,
    "tpu_sample": TpuSample,
    "ici_sample": IciSample,
    "xid_event": XidEvent,
    "node_event": NodeEvent,
    "capacity_event": CapacityEvent,
    "inventory": Inventory,
    "policy_release": PolicyRelease,
    "finding": Finding,
    "proposal": Proposal,
    "action": Action,
    "node_state": NodeState,
    "alert": Alert,
    "utilization": Utilization,
    "dead_letter": DeadLetter,
}
