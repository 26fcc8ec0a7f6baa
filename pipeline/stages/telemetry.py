"""The telemetry stage: every device detector, per node (GPU, XID, fabric) or slice (TPU, ICI).

Reads the telemetry topics, the inventory (membership: kept for the door, passed on to the
guard) and the announcements (node and capacity events re-keyed by target: planned silence).
Keyed by `cluster/node` or `cluster/slice` (keys.py); its state is `TelemetryState`
(telemetry_state.py). A record passes the door (telemetry_door.py), the plausibility screen,
then the detectors and the utilization windows; GPU and TPU samples move the partition's
clock of their family, and every tick boundary it crosses runs the staleness checks of the
partition's keys (`tick`, also the driver's `on_time` for a quiet partition). Outputs:
findings, utilization rows, the fleet stage's input (fabric ticks and port findings, peer
samples), the inventory to the policy stage, dead letters for refused records.

Not replayable (Stage.replayable): it reads the partition's clocks and the wall clock.
"""

from __future__ import annotations

from pipeline.errors import DecodeError
from pipeline.model import (
    CapacityEvent,
    Event,
    FabricSample,
    Inventory,
    NodeEvent,
    Utilization,
)
from pipeline.stages import telemetry_state as ts
from pipeline.stages.base import (
    Out,
    Part,
    Refusal,
    Stage,
    control_door,
    expect_key,
    finding_out,
)
from pipeline.stages.clock import Family
from pipeline.stages.keys import GUARD_KEY, announcement_key, record_key, row_key
from pipeline.stages.telemetry_door import door
from pipeline.wire.internal import (
    ANNOUNCE_INPUT,
    CAPACITY_INPUT,
    CAPACITY_KEY,
    DEAD_LETTERS,
    FLEET_INPUT,
    INVENTORY,
    POLICY_INPUT,
    TELEMETRY_TABLE,
    TELEMETRY_TOPICS,
)


def key(event: Event | None, got: str | None) -> str:
    if event is None:  # an inventory tombstone: the target left
        if got is None:
            raise DecodeError(field="key", expected="cluster/name", got="no key")
        return got
    if isinstance(event, Inventory):
        return expect_key(got, record_key(event), "cluster/name")
    if isinstance(event, NodeEvent | CapacityEvent):
        announced = announcement_key(event)
        if announced is None:
            raise DecodeError(field="$.target", expected="the node or slice announced", got="null")
        return expect_key(got, announced, "target")
    assert isinstance(event, ts.Telemetry)  # the topic's value type guarantees it
    what = "cluster/slice" if hasattr(event, "slice") else "cluster/node"
    return expect_key(got, record_key(event), what)


def on_item(part: Part, event: Event | None, key: str) -> list[Out]:
    if isinstance(event, Inventory):
        refused = control_door(part, event, key)
        if refused:
            return refused
    if event is None or isinstance(event, Inventory):
        return _on_inventory(part, event, key)
    if isinstance(event, NodeEvent | CapacityEvent):
        state = part.get(key, ts.TelemetryState)
        if state is not None:  # a node or slice goes away on purpose: tell its detectors
            part.put(key, ts.on_announcement(state, event))
        return []
    assert isinstance(event, ts.Telemetry)
    return _on_telemetry(part, event, key)


def _on_telemetry(part: Part, event: ts.Telemetry, key: str) -> list[Out]:
    family = ts.FAMILY_OF[type(event)]
    clock = part.clock(ts.DOOR_CLOCK[type(event)])
    state = part.get(key, ts.TelemetryState)
    state, admitted, refusal, skew = door(state, event, clock, part.settings, part.wall_ms)
    part.put(key, state)
    outs = [finding_out(finding) for finding in skew]
    if refusal is not None or admitted is None:
        return [*outs, Out(DEAD_LETTERS, key, refusal or Refusal("refused", "refused"))]
    if part.settings.inventory.enforce and state.inventory is None:
        part.count("unknown_target")  # processed, never removed (pipeline/decide/guard.py)
    admitted, impossible = ts.screen(admitted)
    for _ in range(impossible):
        part.count("impossible_values")  # missing data, not evidence (detect/plausible.py)
    if isinstance(admitted, ts.CLOCK_MOVERS):
        outs += tick(part, family, part.observe(family, key, admitted.ts))
        state = part.get(key, ts.TelemetryState)  # the tick may have changed it
    elif isinstance(admitted, FabricSample):
        part.observe("fabric", key, admitted.ts)  # its door clock only: it ticks nothing
    state, findings, rows = ts.on_telemetry(state, admitted, part.settings)
    fleet = ts.fleet_inputs(state, admitted, findings, part.settings)
    part.put(key, state)
    part.note_key(key, family)
    outs += [finding_out(finding) for finding in findings] + _rows(rows)
    cluster = admitted.cluster
    return outs + [Out(FLEET_INPUT, cluster, signal) for signal in fleet]


def _on_inventory(part: Part, event: Inventory | None, key: str) -> list[Out]:
    """What the fleet's owner says a target is (None: a tombstone, it left): kept for the door,
    and passed to the policy stage, whose guard counts members for the budgets."""
    part.put(key, ts.on_inventory(part.get(key, ts.TelemetryState), event))
    if event is None:  # the capacity view forgets it (keyed by the member: see stages/capacity)
        return [Out(CAPACITY_INPUT, key, None)]
    return [Out(POLICY_INPUT, GUARD_KEY, event), Out(CAPACITY_INPUT, CAPACITY_KEY, event)]


def tick(part: Part, family: Family, boundaries: list[int]) -> list[Out]:
    """The `family` clock of the partition crossed `boundaries`: check its keys for silence,
    with each boundary as "now" (the same ids whichever driver runs it)."""
    outs: list[Out] = []
    resumed = part.clock(family).resumed
    for now_ms in boundaries:
        for key in part.keys(family):
            state = part.get(key, ts.TelemetryState)
            if state is None:
                continue
            try:
                state, findings = ts.on_time(state, now_ms, part.settings, resumed)
            except Exception as exc:  # no record is to blame: the driver rolls the key back
                part.failed(key, now_ms, exc)
                continue
            state, rows = ts.close_silent_windows(state, now_ms, part.settings)
            part.put(key, state)
            outs += [finding_out(f) for f in findings] + _rows(rows)
    return outs


def flush(part: Part) -> list[Out]:
    """End of input: close the utilization windows still open."""
    outs: list[Out] = []
    for key in part.keys(None):
        state = part.get(key, ts.TelemetryState)
        if state is not None:
            outs += _rows(ts.flush_windows(state))
    return outs


def _rows(rows: list[Utilization]) -> list[Out]:
    """Each row to fleet.utilization and to the capacity view (allocation, idle)."""
    outs = []
    for row in rows:
        outs += [Out("utilization", row_key(row), row), Out(CAPACITY_INPUT, CAPACITY_KEY, row)]
    return outs


STAGE = Stage(
    name="telemetry",
    inputs=(*TELEMETRY_TOPICS, ANNOUNCE_INPUT, INVENTORY),
    aligned=TELEMETRY_TOPICS,
    table=TELEMETRY_TABLE,
    key=key,
    on_item=on_item,
    on_time=tick,
    on_eof=flush,
    outputs=("findings", "utilization", POLICY_INPUT, FLEET_INPUT, CAPACITY_INPUT, DEAD_LETTERS),
    replayable=False,
)
