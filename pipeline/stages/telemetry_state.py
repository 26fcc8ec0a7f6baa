"""The telemetry stage's state for one node or slice, and what its detectors do with a record.

Pure functions over `TelemetryState` (the stage's module, telemetry.py, runs them over a
partition; telemetry_door.py checks a record before it gets here): a record through the
detectors and the utilization windows, the staleness checks at a tick, the windows of a
silent key, announcements (planned silence), inventory, and what goes on to the fleet stage.
"""

from __future__ import annotations

import msgspec

from pipeline import detect
from pipeline.config import Settings
from pipeline.detect import job_peers, plausible
from pipeline.model import (
    CapacityEvent,
    FabricSample,
    FabricTick,
    Finding,
    GpuSample,
    IciSample,
    Inventory,
    NodeEvent,
    TpuSample,
    Utilization,
    XidEvent,
)
from pipeline.stages import windows
from pipeline.stages.clock import ClockName, Family
from pipeline.stages.cluster import FleetSignal

Telemetry = GpuSample | XidEvent | TpuSample | IciSample | FabricSample
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
DOOR_CLOCK: dict[type, ClockName] = {**FAMILY_OF, FabricSample: "fabric"}
OFFSET_MIN_MS = 30_000  # a node's offset from the partition clock below this is the tick's
# node events that say the node was repaired (GPU reset or replaced) or rebuilt
REPAIRED = frozenset({"repaired", "created"})


class TelemetryState(msgspec.Struct, kw_only=True):
    """Everything the telemetry stage keeps for one node (GPU + XID + fabric) or one slice (TPU +
    ICI)."""

    gpu: detect.GpuNodeState | None = None
    fabric: detect.FabricNodeState | None = None
    xid: detect.XidState | None = None
    tpu: detect.TpuSliceState | None = None
    ici: detect.IciSliceState | None = None
    window: windows.WindowState | None = None
    inventory: Inventory | None = None  # what the fleet's owner says this target is
    heard_ms: int | None = None  # a refused record arrived then: talking, with a wrong clock
    # how far the node's GPU samples are stamped behind the partition's clock when they arrive,
    # so its silence is measured in its own time base (on_time)
    offset_ms: int = 0
    # the same per host of a TPU slice, signed (the slice's hosts share its key, not their
    # clocks; detect/tpu.check_stale_tpu says how it is used)
    host_offsets: dict[str, int] = {}
    skew_since: int | None = None  # open clock_skew episode (reference time it opened)
    in_job: bool = False  # the last GPU sample ran a job (fleet_inputs: job peers)
    placed: bool = False  # the fleet stage has this inventory record (fleet_inputs)


def family_of(state: TelemetryState) -> Family | None:
    if state.gpu is not None or state.xid is not None or state.fabric is not None:
        return "gpu"
    if state.tpu is not None or state.ici is not None:
        return "tpu"
    return None


def on_telemetry(
    state: TelemetryState | None, event: Telemetry, settings: Settings
) -> tuple[TelemetryState, list[Finding], list[Utilization]]:
    state = state or TelemetryState()
    rows: list[Utilization] = []
    if isinstance(event, GpuSample):
        state.gpu, findings = detect.detect_gpu(state.gpu, event, settings.detect)
        state.window, rows = windows.aggregate(state.window, event, settings.aggregate)
    elif isinstance(event, XidEvent):
        state.xid, findings = detect.detect_xid(state.xid, event, settings.detect)
    elif isinstance(event, FabricSample):
        state.fabric, findings = detect.detect_fabric(state.fabric, event, settings.detect)
    elif isinstance(event, TpuSample):
        state.tpu, findings = detect.detect_tpu(state.tpu, event, settings.detect)
        # the slice's windows are in the partition's time base: a host stamping off is moved
        # there (one ahead would close its siblings' windows, one behind find them closed)
        offset = host_offset(state, event.node)
        placed = msgspec.structs.replace(event, ts=event.ts + offset) if offset else event
        state.window, rows = windows.aggregate(state.window, placed, settings.aggregate)
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
        return state, []  # it reports with a wrong clock (see the door), or the stream resumed
    findings: list[Finding] = []
    if state.gpu is not None:
        # A node is silent when its records stop arriving, not when they arrive stamped late:
        # its silence is measured in its own time base (a host 240 s behind, reporting on
        # time, was judged down). A few seconds of offset are the clock's tick, not a skew.
        node_now = now_ms - own_offset(state)
        state.gpu, stale = detect.check_stale_gpu(state.gpu, node_now, settings.detect)
        findings += stale
    if state.xid is not None:
        state.xid, closed = detect.expire_xid(state.xid, now_ms, settings.detect)
        findings += closed
    if state.tpu is not None:
        # each host's silence in its own time base, as a GPU node's
        offsets = {host: host_offset(state, host) for host in state.host_offsets}
        state.tpu, stale = detect.check_stale_tpu(state.tpu, now_ms, settings.detect, offsets)
        findings += stale
    return state, findings


def own_offset(state: TelemetryState) -> int:
    return state.offset_ms if abs(state.offset_ms) > OFFSET_MIN_MS else 0


def host_offset(state: TelemetryState, host: str) -> int:
    """How far a TPU slice's host stamps behind the partition's clock (negative: ahead; 0
    within the tick)."""
    offset = state.host_offsets.get(host, 0)
    return offset if abs(offset) > OFFSET_MIN_MS else 0


def close_silent_windows(
    state: TelemetryState, now_ms: int, settings: Settings
) -> tuple[TelemetryState, list[Utilization]]:
    """A key silent for two windows has its open windows closed on the partition's time, so a
    node that died still has its last minutes in the lake. Keys that report close their own
    windows as their data moves on, which keeps late-arrival rules per key."""
    window = state.window
    if window is None or not window.open:
        return state, []
    now_ms -= own_offset(state)  # a node stamping late is not silent (on_time)
    if now_ms - window.newest_ts < 2 * settings.aggregate.window_s * 1000:
        return state, []
    state.window, rows = windows.advance(window, now_ms, settings.aggregate)
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


def flush_windows(state: TelemetryState) -> list[Utilization]:
    """End of stream: close the windows still open (embedded runtime, backtests)."""
    return windows.flush(state.window) if state.window is not None else []
