"""Per-key dispatch shared by both runtimes: which pure function a record goes to, under what key.

The embedded runtime (pipeline/runtime/embedded.py) and the faust app (streams/) call only
these functions, so a test of one runtime is a test of the logic of both. Each `on_*`
function takes the key's state (or None for a new key) and returns the new state and outputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from pipeline import detect
from pipeline.config import Settings
from pipeline.decide import guard, health, policy
from pipeline.detect import job_peers, plausible
from pipeline.ids import stable_id
from pipeline.model import (
    Action,
    Alert,
    CapacityEvent,
    Entity,
    Evidence,
    FabricSample,
    FabricTick,
    Finding,
    GpuSample,
    IciSample,
    Inventory,
    NodeEvent,
    NodeState,
    PolicyRelease,
    Proposal,
    Target,
    TpuSample,
    Utilization,
    WithheldRecord,
    XidEvent,
)
from pipeline.stages import windows as aggregate
from pipeline.stages.clock import RobustClock
from pipeline.stages.cluster import FleetSignal
from pipeline.wire.topics import record_key, scoped

# Staleness is checked each time event time crosses a TICK_MS boundary; both runtimes use
# the boundary itself as "now", so replays and the two runtimes agree on finding ids.
REPUBLISH_MS = 5 * 60_000
Telemetry = GpuSample | XidEvent | TpuSample | IciSample | FabricSample
HealthSignal = Finding | NodeEvent | Action
# node events that say the node was repaired (GPU reset or replaced) or rebuilt
REPAIRED = frozenset({"repaired", "created"})
PolicySignal = Proposal | NodeState | CapacityEvent | Inventory | PolicyRelease
S = TypeVar("S")
Family = Literal["gpu", "tpu"]
FAMILIES: tuple[Family, ...] = ("gpu", "tpu")
# Which clock an event belongs to; GPU and TPU samples move theirs. XIDs and ICI samples
# come from other sources: checked against their family's clock, they move none (fabric
# samples: see DOOR_CLOCK).
FAMILY_OF: dict[type, Family] = {
    GpuSample: "gpu",
    XidEvent: "gpu",
    FabricSample: "gpu",
    TpuSample: "tpu",
    IciSample: "tpu",
}
CLOCK_MOVERS = (GpuSample, TpuSample)
# The clock a record is checked against at the door. Fabric samples come from node_exporter,
# scraped apart from DCGM: they are checked against a clock of their own, which they move, so
# an outage of the GPU exporters alone does not refuse them as ahead of a stopped GPU clock.
# Only the families' clocks tick (staleness is the GPU samples' business).
ClockName = Family | Literal["fabric"]
CLOCKS: tuple[ClockName, ...] = (*FAMILIES, "fabric")
DOOR_CLOCK: dict[type, ClockName] = {**FAMILY_OF, FabricSample: "fabric"}
CLOCK_SKEW = "clock_skew"
OFFSET_MIN_MS = 30_000  # a node's offset from the partition clock below this is the tick's
GUARD_KEY = "*guard"  # the guard's key among the policy states (no pool name has a '*')


class TelemetryState(msgspec.Struct, kw_only=True):
    """Everything the telemetry stage keeps for one node (GPU + XID + fabric) or one slice (TPU +
    ICI)."""

    gpu: detect.GpuNodeState | None = None
    fabric: detect.FabricNodeState | None = None
    xid: detect.XidState | None = None
    tpu: detect.TpuSliceState | None = None
    ici: detect.IciSliceState | None = None
    window: aggregate.WindowState | None = None
    inventory: Inventory | None = None  # what the fleet's owner says this target is
    heard_ms: int | None = None  # a refused record arrived then: talking, with a wrong clock
    # how far the node's GPU samples are stamped behind the partition's clock when they arrive,
    # so its silence is measured in its own time base (on_time)
    offset_ms: int = 0
    skew_since: int | None = None  # open clock_skew episode (reference time it opened)
    in_job: bool = False  # the last GPU sample ran a job (fleet_inputs: job peers)
    placed: bool = False  # the fleet stage has this inventory record (fleet_inputs)


class Refusal(NamedTuple):
    """Why a record is not let in: `reason` for metrics, `message` for the dead letter."""

    reason: str  # "ahead", "behind", "late", "inventory_mismatch"
    message: str


def telemetry_key(event: Telemetry) -> str:
    return record_key(event)


def on_telemetry(
    state: TelemetryState | None, event: Telemetry, settings: Settings
) -> tuple[TelemetryState, list[Finding], list[Utilization]]:
    state = state or TelemetryState()
    rows: list[Utilization] = []
    if isinstance(event, GpuSample):
        state.gpu, findings = detect.detect_gpu(state.gpu, event, settings.detect)
        state.window, rows = aggregate.aggregate(state.window, event, settings.aggregate)
    elif isinstance(event, XidEvent):
        state.xid, findings = detect.detect_xid(state.xid, event, settings.detect)
    elif isinstance(event, FabricSample):
        state.fabric, findings = detect.detect_fabric(state.fabric, event, settings.detect)
    elif isinstance(event, TpuSample):
        state.tpu, findings = detect.detect_tpu(state.tpu, event, settings.detect)
        state.window, rows = aggregate.aggregate(state.window, event, settings.aggregate)
    else:
        state.ici, findings = detect.detect_ici(state.ici, event, settings.detect)
    return state, findings, rows


def screen(event: Telemetry) -> tuple[Telemetry, int]:
    """The record without the values no working device reports (detect/plausible.py), and how
    many were taken out."""
    if isinstance(event, GpuSample):
        return plausible.screen_gpu(event)
    if isinstance(event, FabricSample):
        return plausible.screen_fabric(event)
    return event, 0


def fleet_inputs(
    state: TelemetryState, admitted: Telemetry, findings: list[Finding], settings: Settings
) -> list[FleetSignal]:
    """What the telemetry stage passes on to the fleet stage for one admitted record: a fabric
    sample's port findings, after its node's inventory (placement) the first time, and its
    tick (the event time that turns troubles no switch explains into link verdicts; not the
    sample's port counters, which the fleet stage never reads); for a GPU sample of a node
    that runs, or ran until now, a job: its peer sample."""
    if isinstance(admitted, FabricSample):
        placed: list[FleetSignal] = []
        if state.inventory is not None and not state.placed:
            placed, state.placed = [state.inventory], True
        tick = FabricTick(ts=admitted.ts, cluster=admitted.cluster, node=admitted.node)
        return [*placed, *findings, tick]
    if isinstance(admitted, GpuSample):
        in_job = any(gpu.job is not None for gpu in admitted.gpus)
        was_in_job, state.in_job = state.in_job, in_job
        if not (in_job or was_in_job):
            return []
        # the few numbers job peers compare, not the whole scrape (a tenth of its bytes)
        return [job_peers.peer_sample(admitted, settings.detect)]
    return []


def door(
    state: TelemetryState | None,
    event: Telemetry,
    clock: RobustClock,
    settings: Settings,
    wall_ms: int | None = None,
) -> tuple[TelemetryState, Telemetry | None, Refusal | None, list[Finding]]:
    """Check a record at the door: its time against the stream's clock (and the wall clock,
    where the driver has one), its identity against the inventory, its window against the
    key's closed ones. Returns the state, the event to process (None when refused; with the
    inventory's identity when mismatches are only flagged), the refusal, and a watch-only
    clock_skew finding when the host's clock goes off or comes back."""
    state = state or TelemetryState()
    key = telemetry_key(event)
    verdict = clock.check(event.ts, wall_ms, key)
    reference = clock.reference()
    if verdict is not None:
        if verdict.reason == "ahead":
            clock.claim(key, event.ts)  # a quorum of such claims moves the clock (clock.py)
        state.heard_ms = reference if reference is not None else state.heard_ms
        skew = _skew_finding(state, event, reference, verdict.skew_ms, settings)
        return state, None, Refusal(verdict.reason, verdict.message), skew
    findings = _skew_finding(state, event, reference, clock.skew(event.ts), settings)
    if isinstance(event, GpuSample) and reference is not None:
        # liveness from arrival (on_time): how far behind the clock it stamps. Never ahead: a
        # record past the clock is a stream resuming (the clock follows), or a host ahead,
        # whose records already look fresh
        state.offset_ms = max(0, reference - event.ts)
    refusal = _identity(state.inventory, event)
    if refusal is not None:
        if settings.inventory.on_mismatch == "dead_letter":
            return state, None, refusal, findings
        assert state.inventory is not None  # a mismatch needs an inventory record
        event = msgspec.structs.replace(
            event, pool=state.inventory.pool, zone=state.inventory.zone
        )
    window = state.window
    if isinstance(event, CLOCK_MOVERS) and window is not None and event.ts < window.closed_before:
        late = Refusal(
            "late",
            f"$.ts: expected an event time at or after {window.closed_before} (the windows "
            f"before it are closed and written), got {event.ts}",
        )
        return state, None, late, findings
    return state, event, None, findings


def _identity(inventory: Inventory | None, event: Telemetry) -> Refusal | None:
    if inventory is None:
        return None
    for field, expected in (("pool", inventory.pool), ("zone", inventory.zone)):
        got = getattr(event, field)
        if got != expected:
            return Refusal(
                "inventory_mismatch",
                f"$.{field}: expected {expected!r} (the inventory's {field} of "
                f"{scoped(inventory.cluster, inventory.name)}), got {got!r}",
            )
    return None


def _skew_finding(
    state: TelemetryState,
    event: Telemetry,
    reference: int | None,
    off_ms: int | None,
    settings: Settings,
) -> list[Finding]:
    """Open a clock_skew episode when a host's clock is off, close it when it is back."""
    if reference is None:
        return []
    is_off = off_ms is not None and abs(off_ms) > settings.clock.skew_finding_s * 1000
    if is_off == (state.skew_since is not None):
        return []
    since = state.skew_since if state.skew_since is not None else reference
    state.skew_since = reference if is_off else None
    target = _target_of(event)
    phase = "open" if is_off else "close"
    fid = stable_id("fnd", CLOCK_SKEW, target.cluster, target.name, str(since), phase)
    off_s = abs(off_ms or 0) / 1000
    side = "ahead of" if (off_ms or 0) > 0 else "behind"
    message = (
        f"event time of {target.name} is {off_s:.0f} s {side} the partition's clock"
        if is_off
        else f"event time of {target.name} agrees with the partition's clock again"
    )
    evidence = Evidence(
        metric="event_time_skew_s",
        value=None if off_ms is None else off_ms / 1000,
        baseline=0.0,
        score=None,
        window_s=0,
    )
    finding = Finding(
        finding_id=fid,
        ts=reference,
        entity=Entity(kind=target.kind, target=target),
        check=CLOCK_SKEW,
        severity="warning" if is_off else "info",
        healthy=not is_off,
        recommended_action="watch" if is_off else "none",
        evidence=evidence,
        message=message,
    )
    return [finding]


def _target_of(event: Telemetry) -> Target:
    if isinstance(event, GpuSample | XidEvent | FabricSample):
        return Target(
            cluster=event.cluster, kind="node", name=event.node, pool=event.pool, zone=event.zone
        )
    return Target(
        cluster=event.cluster, kind="slice", name=event.slice, pool=event.pool, zone=event.zone
    )


def on_inventory(state: TelemetryState | None, record: Inventory | None) -> TelemetryState:
    """The fleet's owner says what this target is (None: it left the inventory)."""
    state = state or TelemetryState()
    state.inventory, state.placed = record, False
    return state


def on_time(
    state: TelemetryState, now_ms: int, settings: Settings, resumed_ms: int | None = None
) -> tuple[TelemetryState, list[Finding]]:
    """Event time moved on in this partition: a node or host that stopped reporting is news.
    `resumed_ms`: where the stream resumed after a gap of the whole stream (clock.py); a key
    is not judged silent for the gap, only from there."""
    heard = max(state.heard_ms or 0, resumed_ms or 0)
    if heard and now_ms - heard <= settings.detect.node_down_s * 1000:
        return state, []  # it reports with a wrong clock (see door), or the stream just resumed
    findings: list[Finding] = []
    if state.gpu is not None:
        # A node is silent when its records stop arriving, not when they arrive stamped late:
        # its silence is measured in its own time base (a host 240 s behind, reporting on
        # time, was judged down). A few seconds of offset are the clock's tick, not a skew.
        node_now = now_ms - _own_offset(state)
        state.gpu, stale = detect.check_stale_gpu(state.gpu, node_now, settings.detect)
        findings += stale
    if state.xid is not None:
        state.xid, closed = detect.expire_xid(state.xid, now_ms, settings.detect)
        findings += closed
    if state.tpu is not None:
        state.tpu, stale = detect.check_stale_tpu(state.tpu, now_ms, settings.detect)
        findings += stale
    return state, findings


def _own_offset(state: TelemetryState) -> int:
    return state.offset_ms if abs(state.offset_ms) > OFFSET_MIN_MS else 0


def close_silent_windows(
    state: TelemetryState, now_ms: int, settings: Settings
) -> tuple[TelemetryState, list[Utilization]]:
    """A key silent for two windows has its open windows closed on the partition's time, so a
    node that died still has its last minutes in the lake. Keys that report close their own
    windows as their data moves on, which keeps late-arrival rules per key."""
    window = state.window
    if window is None or not window.open:
        return state, []
    now_ms -= _own_offset(state)  # a node stamping late is not silent (on_time)
    if now_ms - window.newest_ts < 2 * settings.aggregate.window_s * 1000:
        return state, []
    state.window, rows = aggregate.advance(window, now_ms, settings.aggregate)
    return state, rows


def on_announcement(
    state: TelemetryState | None, event: NodeEvent | CapacityEvent
) -> TelemetryState:
    """Someone says this node or slice goes away on purpose (drained, deleted, maintenance,
    preemption): silence after that is expected, not a failure. Keyed by the event's target,
    which is the telemetry key of that node or slice."""
    state = state or TelemetryState()
    if state.xid is not None and isinstance(event, NodeEvent) and event.kind in REPAIRED:
        state.xid = detect.note_repair(state.xid, event.ts)
    if state.gpu is not None:
        state.gpu = detect.note_event(state.gpu, event)
    if state.tpu is not None:
        state.tpu = detect.note_event(state.tpu, event)
    return state


def announcement_key(event: NodeEvent | CapacityEvent) -> str | None:
    if event.target is None or event.cluster is None:
        return None  # a zone-wide capacity event names no node or slice
    return scoped(event.cluster, event.target)


def flush_windows(state: TelemetryState) -> list[Utilization]:
    """End of stream: close the windows still open (embedded runtime, backtests)."""
    return aggregate.flush(state.window) if state.window is not None else []


def health_key(signal: HealthSignal) -> str:
    if isinstance(signal, Finding):
        return target_name(signal.entity.target)
    if isinstance(signal, Action):
        return target_name(signal.target)
    return scoped(signal.cluster, signal.target)


def target_name(target: Target) -> str:
    """The key of everything about one node or slice: `cluster/name`."""
    return scoped(target.cluster, target.name)


def on_health(
    state: health.HealthState | None, signal: HealthSignal, settings: Settings
) -> tuple[health.HealthState, list[Proposal], NodeState | None]:
    """Returns the node state to publish when it changed (or on first sight), else None."""
    before = None if state is None else health.to_node_state(state)
    state, proposals = health.transition(state, signal, settings.health)
    after = health.to_node_state(state)
    changed = before is None or _state_changed(before, after)
    return state, proposals, after if changed else None


def _state_changed(before: NodeState, after: NodeState) -> bool:
    # `ts` moves with every heartbeat; a change of what the state says is news, and so is the
    # first signal of each REPUBLISH_MS of event time: the policy has no clock but its inputs,
    # and maintenance lead times or throttled proposals must not wait for the next failure.
    if before.ts // REPUBLISH_MS != after.ts // REPUBLISH_MS:
        return True
    return msgspec.structs.replace(before, ts=after.ts) != after


def pool_key(target: Target) -> str:
    """The policy's key: pool names repeat across clusters (GKE's "default-pool"), budgets
    must not, so a pool is named within its cluster."""
    return f"{target.cluster}/{target.pool}"


def policy_key(signal: Proposal | NodeState) -> str:
    return pool_key(signal.target)


def capacity_pools(event: CapacityEvent, pools_by_zone: Mapping[str, Iterable[str]]) -> list[str]:
    """Capacity events are keyed by zone; the policy is per pool. An event naming its pool goes
    to that pool, a zone-wide one (quota, stock-out) to every pool known in the zone."""
    known = sorted(pools_by_zone.get(event.zone, ()))
    if event.pool is not None and event.cluster is not None:
        return [f"{event.cluster}/{event.pool}"]
    if event.pool is not None:
        return [key for key in known if key.partition("/")[2] == event.pool]
    return known


class PolicyOutcome(NamedTuple):
    state: policy.PolicyState | None
    fleet: guard.GuardState
    actions: list[Action]
    alerts: list[Alert]
    withheld: list[WithheldRecord]  # why proposals were held back or dropped


def on_policy(
    state: policy.PolicyState | None,
    fleet: guard.GuardState | None,
    signal: PolicySignal,
    settings: Settings,
    pool: str,
) -> PolicyOutcome:
    """One policy-stage input: the guard learns from it (membership, open checks, releases),
    then the pool decides, gated by the guard (caps, common causes); the guard then learns
    what the pool has out. Inventory records and releases concern the guard only."""
    alerts: list[Alert] = []
    if isinstance(signal, CapacityEvent):
        fleet = fleet or guard.GuardState()
    else:
        fleet, alerts = guard.observe(fleet, signal, settings)
    if isinstance(signal, Inventory | PolicyRelease):
        return PolicyOutcome(state, fleet, [], alerts, [])
    gate = guard.view(fleet, settings, pool)
    state, actions, pool_alerts, withheld = policy.decide_all(
        state, signal, settings.policy, gate
    )
    out = policy.out_for_faults(state, settings.policy)
    fleet = guard.settle(fleet, gate, pool, out, policy.maintenance_out(state))
    notices = {
        key: guard.Mark(pool=pool, zone=zone, ts=ts)
        for key, (zone, ts) in policy.maintenance_notices(state).items()
    }
    if guard.note_maintenance(fleet, pool, notices):
        alerts += guard.sync(fleet, settings)
    return PolicyOutcome(state, fleet, actions, alerts + pool_alerts, withheld)


_ENCODER = msgspec.msgpack.Encoder()


def encode_state(state: Any) -> bytes:
    """States go into faust tables as msgpack (compact, and msgspec Structs round-trip)."""
    return _ENCODER.encode(state)


def decode_state(raw: bytes, cls: type[S]) -> S:
    return msgspec.msgpack.decode(raw, type=cls)
